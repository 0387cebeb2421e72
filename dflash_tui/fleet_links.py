"""The fleet's connections: one Link (one connection) and one Store per target, each
following its run root's latest run, started and closed together. The TUI's dashboard of a
target reuses that target's link and store (widgets/fleet.py): opening it costs no second
connection.

`settle()` is `--once`'s wait: every target at the same time, a target with no session
within `reach_s` given up on as unreachable, a connected one waited for as `status` waits
(headless.settled), all within `settle_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from dflash_tui.diagnosis import DiagnosisConfig, config_for
from dflash_tui.fleet import FleetRow, row_of
from dflash_tui.headless import settled
from dflash_tui.link.events import LinkStatus, SinkEvent
from dflash_tui.link.link import Link
from dflash_tui.state import Store
from dflash_tui.targets import Target

REACH_S = 3.0  # a target with no agent session by then is reported unreachable
SETTLE_S = 15.0  # as `status` waits for a connected one's complete picture


class Member:
    """One target: its store, and its link feeding the store through `apply`."""

    def __init__(self, target: Target, clock: Callable[[], float]) -> None:
        self.target = target
        self.store = Store(target.name, clock=clock)
        self.link = Link(target, self.apply)
        self.config: DiagnosisConfig = config_for(target.extra)
        self.cause: str | None = None  # why the link last went down; None once connected
        self.gave_up = False  # --once stopped waiting for its first session

    def apply(self, event: SinkEvent) -> None:
        if isinstance(event, LinkStatus) and not self.gave_up:
            if event.state == "connected":
                self.cause = None
            elif event.state in ("reconnecting", "refused"):
                self.cause = event.detail
        self.store.apply(event)

    def row(self, now: float | None = None) -> FleetRow:
        return row_of(self.target, self.store, self.config, now, self.cause, self.gave_up)


class Fleet:
    def __init__(self, targets: list[Target], clock: Callable[[], float] = time.time) -> None:
        self.members = [Member(t, clock) for t in targets]

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.target.name == name)

    def start(self) -> None:
        for m in self.members:
            m.link.start()

    async def close(self) -> None:
        """Every link closed (the remote runs are left alone), concurrently."""
        await asyncio.gather(*(m.link.close() for m in self.members), return_exceptions=True)

    def rows(self, now: float | None = None) -> list[FleetRow]:
        return [m.row(now) for m in self.members]

    async def settle(self, reach_s: float = REACH_S, settle_s: float = SETTLE_S) -> None:
        await asyncio.gather(*(self._settle_one(m, reach_s, settle_s) for m in self.members))

    async def _settle_one(self, m: Member, reach_s: float, settle_s: float) -> None:
        t0 = time.monotonic()
        while m.store.hello is None and m.store.link.state != "refused":
            if time.monotonic() - t0 > reach_s:
                m.cause = m.cause or f"no session within {reach_s:.0f}s"
                m.gave_up = True
                await m.link.close()  # its backoff would go on retrying
                return
            await asyncio.sleep(0.05)
        if m.store.hello is not None:
            await settled(m.store, settle_s - (time.monotonic() - t0))
