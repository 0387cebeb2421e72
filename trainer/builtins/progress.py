"""How far a builtin being built on first use has got (the chat-trained tiny target trains
for a minute, its answers take 20 s more), for whoever is watching: a run's setup installs a
reporter, so the heartbeat's `phase_progress` counts it; elsewhere nothing is reported."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Reporter = Callable[[str, int, int], None]  # (unit, done, total)
_reporter: Reporter | None = None


@contextlib.contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    global _reporter
    before, _reporter = _reporter, reporter
    try:
        yield
    finally:
        _reporter = before


def report(unit: str, done: int, total: int) -> None:
    if _reporter is not None:
        _reporter(unit, done, total)
