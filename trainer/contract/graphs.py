"""CUDA graphs in the heartbeat: where the trainer captures them, whether they work.

Operators asked more than once whether CUDA graphs were working. `Heartbeat.graphs` (optional
under schema 2: {} from older trainers and from runs without such a place) answers per place
the trainer captures graphs (now: `eval`, the held-out eval's decode step,
trainer/evaluation/graphs.py): whether they are in use, or why not; how many were captured
and replayed; and each capture that failed, with its reason. A failed capture never stops
the run: that work runs eagerly instead (`eager_runs` counts it), slower.
"""

from __future__ import annotations

import dataclasses

# The failures kept in the heartbeat, newest last: enough to see a reason repeat.
MAX_FAILURES = 8


@dataclasses.dataclass
class GraphFailure:
    at: float  # unix time
    reason: str  # one line: the exception's type and message


@dataclasses.dataclass
class GraphInfo:
    """One place's CUDA graphs."""

    enabled: bool = False  # graphs are asked for and possible here: captures are tried
    off_reason: str | None = None  # when not enabled: why (off in the config, a CPU, ...)
    captured: int = 0  # captures that succeeded
    replays: int = 0
    failed: int = 0  # captures that failed, all of them (`failures` keeps the newest)
    eager_runs: int = 0  # runs of the work done eagerly because its capture failed
    failures: list[GraphFailure] = dataclasses.field(default_factory=list)

    def add_failure(self, at: float, reason: str) -> None:
        self.failed += 1
        self.failures = [*self.failures, GraphFailure(at, reason)][-MAX_FAILURES:]
