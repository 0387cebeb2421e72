"""Helpers for monitor tests: a Link and Store driven from synchronous test code, and
`typed_event`: a hand-written event (a dict, as the agent sends it) through the contract's
decoder, as the link hands it to its sink."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_tui.link.events import LinkStatus, Rtt, SinkEvent, event_json
from dflash_tui.link.link import Link
from dflash_tui.state import Store
from dflash_tui.targets import Target
from trainer.contract.protocol import Command, decode_event

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
NO_WANDB = "runtime.wandb_mode=disabled"


def typed_event(data: dict[str, Any]) -> SinkEvent:
    """An event as the link's sink gets it: the link's own (`link`, `rtt`) as their records,
    an agent event through the contract's decoder (an `Unreadable` when it is none)."""
    fields = {k: v for k, v in data.items() if k != "type"}
    if data.get("type") == "link":
        return LinkStatus(**fields)
    if data.get("type") == "rtt":
        return Rtt(**fields)
    return decode_event(data)


class Remote:
    """A Link on its own event loop thread, so tests can block on conditions. `events` keeps
    what the sink got as JSON (tests read them as the agent sent them); the store, records."""

    def __init__(self, target: Target, follow: str | None = "latest", **link_kw: Any) -> None:
        self.target = target
        self.store = Store(target.name)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.RLock()  # predicates may call lines()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.link = self.call(self._make(follow, link_kw))

    async def _make(self, follow: str | None, link_kw: dict[str, Any]) -> Link:
        link = Link(self.target, self._sink, follow=follow, **link_kw)
        link.start()
        return link

    def _sink(self, event: SinkEvent) -> None:
        with self._lock:
            self.events.append(event_json(event))
            self.store.apply(event)

    def call(self, coro: Any, timeout: float = 240) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def request(self, cmd: Command, timeout: float | None = None, **kw: Any) -> dict[str, Any]:
        """`timeout`: the command's own client timeout unless given."""
        wait = cmd.client_timeout() if timeout is None else timeout
        return self.call(self.link.request(cmd, timeout=wait, **kw), wait + 10)

    def wait(self, predicate: Callable[[Store], Any], timeout: float = 60, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                value = predicate(self.store)
            if value:
                return value
            time.sleep(0.02)
        with self._lock:
            tail = self.events[-8:]
        raise AssertionError(f"timed out waiting for {what or predicate}; last events: {tail}")

    def lines(self, file: str = "train.log") -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("type") == "line" and e.get("file") == file]

    def close(self) -> None:
        try:
            self.call(self.link.close(), 30)
            self.call(self.loop.shutdown_asyncgens(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self.loop.close()


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dflash-tui ARGS` as an operator runs it: a process of its own, from the repo root."""
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
        env={**piped_env(), **(env or {})},
    )


def piped_env() -> dict[str, str]:
    """This process's environment as a pipe's reader has it: without COLUMNS and LINES,
    which a test before may have left set (then `runs` would fit its rows to them)."""
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


async def wait_for(
    pilot: Any, predicate: Callable[[], Any], what: str, timeout: float = 30.0
) -> Any:
    """Pause the Pilot until `predicate()` is truthy and return its value; `what` names it
    when it never is."""
    for _ in range(int(timeout / 0.1)):
        if value := predicate():
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")
