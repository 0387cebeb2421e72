"""`dflash-tui fleet --headless`: the fleet as lines, for cron and tmux panes.

`--once`: every target connected at the same time, each waited for until settled (one with
no session within 3 s is unreachable), one line per target, then exit with the worst
target's status (0 ok, 1 warning, 2 critical, 3 unreachable: headless.exit_code_for's codes).
Without `--once`: the same lines every `--interval` seconds, each block under a clock line.

`--json`: one object per target per snapshot, the FleetRow's fields (dflash_tui/fleet.py):
    {"kind": "fleet", "time": float, "name", "status", "status_word", "connection",
     "run_id", "phase", "step", "tok_s", "heartbeat_age_s",
     "worst": {"severity", "code", "title", "evidence", "action"} | null}
The host's strings are exact there (JSON escapes them) and made visible in the lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import TextIO

from dflash_tui.fleet import FleetRow, worst_status
from dflash_tui.fleet_links import Fleet
from dflash_tui.headless import EXIT_OK
from dflash_tui.targets import Target


def row_json(row: FleetRow, now: float) -> str:
    return json.dumps({"kind": "fleet", "time": now, **row.to_json()}, default=str)


class FleetHeadless:
    def __init__(
        self,
        targets: list[Target],
        out: TextIO | None = None,
        interval: float = 2.0,
        as_json: bool = False,
        once: bool = False,
    ) -> None:
        self.fleet = Fleet(targets)
        self.out = out or sys.stdout
        self.interval = interval
        self.as_json = as_json
        self.once = once
        self._stop = asyncio.Event()

    def write_rows(self, rows: list[FleetRow], now: float) -> None:
        if not self.as_json and not self.once:
            self.out.write(time.strftime("%H:%M:%S", time.localtime(now)) + "\n")
        for row in rows:
            # row.line() has made the host's strings visible already; JSON escapes them
            self.out.write((row_json(row, now) if self.as_json else row.line()) + "\n")
        self.out.flush()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)  # leaves the remote runs alone
        self.fleet.start()
        try:
            if self.once:
                await self.fleet.settle()
                now = time.time()
                rows = self.fleet.rows(now)
                self.write_rows(rows, now)
                return worst_status(rows)
            while not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
                if not self._stop.is_set():
                    now = time.time()
                    self.write_rows(self.fleet.rows(now), now)
            return EXIT_OK
        finally:
            await self.fleet.close()
