"""Where each pipeline thread's loop spends its time, from the heartbeat's stage times.

The trainer writes `ThreadInfo.stages_ms` (trainer/reporting/stages.py): per pipeline thread, the
moving median of each stage's ms per iteration of its loop (one batch for a prefetch or
target thread, one step for a drafter), so the medians add up to about the loop's period.
JSON sorts their keys: every view puts them back in the loop's order here, with the
contract's `ordered_stages`. A "wait …" stage (and `host`: a GPU stream waiting for Python)
is time the thread had nothing to do.

Pure Python, shared by the TUI's stage bars, the headless line, `--json` and the rules.
Names are the host's: a view shows them through dflash_tui/sanitize.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trainer.contract.heartbeat import Heartbeat, ThreadInfo, is_wait, ordered_stages

PIPELINE_ROLES = ("prefetch", "target", "drafter")  # upstream first


@dataclass(frozen=True)
class Stage:
    name: str
    ms: float
    wait: bool


@dataclass(frozen=True)
class ThreadStages:
    """One pipeline thread's loop: its stages in loop order."""

    name: str
    role: str
    device: str
    stages: tuple[Stage, ...]
    state: str = ""  # the thread's state in the heartbeat
    in_state_s: float = 0.0  # … and for how long: medians only change when a loop ends

    @property
    def period_ms(self) -> float:
        return sum(st.ms for st in self.stages)

    @property
    def work_ms(self) -> float:
        return sum(st.ms for st in self.stages if not st.wait)

    @property
    def work_share(self) -> float:
        return self.work_ms / self.period_ms

    @property
    def loop(self) -> str:
        """What one iteration is called in evidence: a drafter's loop is one step."""
        return "step" if self.role == "drafter" else "loop"

    def ms(self, stage: str) -> float:
        return sum(st.ms for st in self.stages if st.name == stage)

    def share(self, stage: str) -> float:
        return self.ms(stage) / self.period_ms

    def top(self) -> Stage:
        """The largest stage, wait or not (ties: the first in loop order)."""
        return max(self.stages, key=lambda st: st.ms)

    def top_work(self) -> Stage | None:
        work = [st for st in self.stages if not st.wait]
        return max(work, key=lambda st: st.ms) if work else None

    def by_size(self) -> list[Stage]:
        return sorted(self.stages, key=lambda st: -st.ms)

    def stale(self) -> bool:
        """In one state for much longer than a loop takes: the medians are of the loops
        before it (a thread blocked for 40 s has not finished the loop that would say so)."""
        return self.in_state_s > max(2.0, 4 * self.period_ms / 1e3)


def _natural(name: str) -> list[Any]:
    """target-2 before target-10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _usable(ms: object) -> bool:
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        return False
    return math.isfinite(ms) and ms >= 0


def thread_stages(hb: Heartbeat, t: ThreadInfo) -> ThreadStages | None:
    """A thread's stages in loop order; None when it has none (not a pipeline thread, no
    loop done yet, an older trainer) or they add up to nothing. A value that is not a
    finite number >= 0 is left out: the heartbeat comes from the host."""
    kept = [
        Stage(name, float(ms), is_wait(name))
        for name, ms in ordered_stages(t.role, t.stages_ms)
        if _usable(ms)
    ]
    total = sum(st.ms for st in kept)
    if not kept or not math.isfinite(total) or total <= 0:  # (two 1e308s make an inf)
        return None
    return ThreadStages(t.name, t.role, t.device, tuple(kept), t.state, hb.in_state_s(t))


def of_heartbeat(hb: Heartbeat | None) -> list[ThreadStages]:
    """The pipeline threads that have stage times: prefetch, targets, drafters, each role's
    threads in name order."""
    if hb is None:
        return []
    rank = {role: i for i, role in enumerate(PIPELINE_ROLES)}
    rows = [
        got
        for t in hb.threads
        if t.role in rank and t.stages_ms and (got := thread_stages(hb, t)) is not None
    ]
    return sorted(rows, key=lambda r: (rank[r.role], _natural(r.name)))


def of_role(rows: list[ThreadStages], role: str) -> list[ThreadStages]:
    return [r for r in rows if r.role == role]


def busiest(rows: list[ThreadStages]) -> ThreadStages | None:
    """The thread that waits least for the others: the largest share of its loop at work
    (ties: the longer loop). In a pipeline it is the stage the others wait for."""
    working = [r for r in rows if r.top_work() is not None]
    return max(working, key=lambda r: (r.work_share, r.period_ms), default=None)


def ms_text(ms: float, space: bool = True) -> str:
    """266 ms, 8.9 ms, 0.03 ms, 5.0 s, 45.2 s: three significant figures at most."""
    sep = " " if space else ""
    if ms >= 1000:
        return f"{ms / 1e3:.0f}{sep}s" if ms >= 100_000 else f"{ms / 1e3:.1f}{sep}s"
    if ms >= 10:
        return f"{ms:.0f}{sep}ms"
    if ms >= 1:
        return f"{ms:.1f}{sep}ms"
    return f"{ms:.2f}{sep}ms"


def to_json(rows: list[ThreadStages]) -> list[dict[str, Any]]:
    """For --json: every thread's stages as a list, in loop order (a JSON object's keys
    would be sorted again by whoever reads it)."""
    return [
        {
            "thread": r.name,
            "role": r.role,
            "device": r.device,
            "period_ms": round(r.period_ms, 3),
            "stages": [
                {
                    "stage": st.name,
                    "ms": st.ms,
                    "share": round(st.ms / r.period_ms, 4),
                    "wait": st.wait,
                }
                for st in r.stages
            ],
        }
        for r in rows
    ]


def busiest_json(rows: list[ThreadStages]) -> dict[str, Any] | None:
    b = busiest(rows)
    top = b.top_work() if b else None
    if b is None or top is None:
        return None
    return {
        "thread": b.name,
        "stage": top.name,
        "ms": top.ms,
        "share": round(top.ms / b.period_ms, 4),
        "period_ms": round(b.period_ms, 3),
        "work_share": round(b.work_share, 4),
    }


def by_role(rows: list[ThreadStages]) -> list[ThreadStages]:
    """One row per role, each stage the mean over the role's threads ("target ×5"): what
    a pane too short for a row per thread shows."""
    out: list[ThreadStages] = []
    for role in PIPELINE_ROLES:
        mine = of_role(rows, role)
        if len(mine) <= 1:
            out.extend(mine)
            continue
        names = list(dict.fromkeys(st.name for r in mine for st in r.stages))
        mean = {n: sum(r.ms(n) for r in mine) / len(mine) for n in names}
        ordered = ordered_stages(role, mean)
        devices = list(dict.fromkeys(r.device for r in mine))
        device = devices[0] if len(devices) == 1 else f"{len(devices)} devices"
        stages = tuple(Stage(n, ms, is_wait(n)) for n, ms in ordered)
        out.append(ThreadStages(f"{role} ×{len(mine)}", role, device, stages))
    return out
