"""The phases of a run, in the order the trainer really walks them, and how long each took.

    starting -> loading_data -> loading_target -> compiling -> [loading_target] -> warmup
             -> training (<-> checkpointing) -> stopping -> finished | stopped | crashed

The target's weights load on a thread while the drafters compile (trainer/runtime/setup.py), so
`loading_target` is visited twice: the first visit starts the load, and a second visit
after `compiling` is the *wait* for weights that are not in yet (absent when they were).
Every visit is kept and keyed by its number ("loading_target", "loading_target#2"), so a
duration is only ever compared with the same visit of earlier runs.

The load itself overlaps both visits; its span is recorded apart (`Heartbeat.target_load`)
and compared with earlier loads: whole load against whole load.
"""

from __future__ import annotations

import dataclasses

STARTING = "starting"
LOADING_DATA = "loading_data"
LOADING_TARGET = "loading_target"
COMPILING = "compiling"
WARMUP = "warmup"
TRAINING = "training"
CHECKPOINTING = "checkpointing"
STOPPING = "stopping"
FINISHED = "finished"  # reached its last step
STOPPED = "stopped"  # SIGTERM/SIGINT before the last step, checkpointed (schema >= 2)
CRASHED = "crashed"

# Every phase a heartbeat may name, in the order of their first visit.
PHASES = (
    STARTING,
    LOADING_DATA,
    LOADING_TARGET,
    COMPILING,
    WARMUP,
    TRAINING,
    CHECKPOINTING,
    STOPPING,
    FINISHED,
    STOPPED,
    CRASHED,
)
FINAL_PHASES = (FINISHED, STOPPED, CRASHED)

# The start-up a healthy run walks, as visit keys: a key counts as done once a later one began.
TARGET_WAIT = f"{LOADING_TARGET}#2"
START_SEQUENCE = (STARTING, LOADING_DATA, LOADING_TARGET, COMPILING, TARGET_WAIT, WARMUP, TRAINING)

# How a person names each visit: titles ("loading data slower than usual") and the heartbeat
# pane ("compile took 4m12s last time").
DOING = {
    STARTING: "starting",
    LOADING_DATA: "loading data",
    LOADING_TARGET: "starting the target load",
    COMPILING: "compiling",
    TARGET_WAIT: "waiting for the target weights",
    WARMUP: "warming up",
}
TOOK = {
    STARTING: "start-up",
    LOADING_DATA: "loading data",
    LOADING_TARGET: "starting the target load",
    COMPILING: "compile",
    TARGET_WAIT: "the target load",  # compared as whole loads: see target_load_seconds()
    WARMUP: "warm-up",
}


@dataclasses.dataclass(frozen=True)
class PhaseVisit:
    """One entry of the heartbeat's `phase_history`: a phase began at `started_at`.

    Schema 2 also records the visit's number and its end, so a history thinned in the
    middle (a long run keeps its start-up and its latest visits) still says the truth."""

    phase: str
    started_at: float
    visit: int = 0  # 0: not recorded (schema 1): counted from the order
    ended_at: float | None = None  # None: not recorded, or the visit is in progress


@dataclasses.dataclass(frozen=True)
class PhaseSpan:
    """One visit of a phase, with its number among visits of that phase (1 = first)."""

    phase: str
    visit: int
    started_at: float
    ended_at: float | None  # None: the run is in it now

    @property
    def key(self) -> str:
        return visit_key(self.phase, self.visit)

    def seconds(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at)


def visit_key(phase: str, visit: int) -> str:
    return phase if visit <= 1 else f"{phase}#{visit}"


def phase_spans(history: list[PhaseVisit], final: bool = False) -> list[PhaseSpan]:
    """Every visit, oldest first; each ends where the next begins. `final`: the run is over,
    so the last entry (a final phase) is an instant, not an open span."""
    counts: dict[str, int] = {}
    spans = []
    for i, v in enumerate(history):
        counts[v.phase] = v.visit or counts.get(v.phase, 0) + 1
        end = v.ended_at
        if end is None and i + 1 < len(history):
            end = history[i + 1].started_at
        if end is None and final:
            end = v.started_at
        spans.append(PhaseSpan(v.phase, counts[v.phase], v.started_at, end))
    return spans


def phase_durations(history: list[PhaseVisit], now: float, final: bool = False) -> dict[str, float]:
    """{visit key: seconds} for every visit ("training#3" is the third training visit). The
    visit in progress counts up to `now`."""
    return {s.key: s.seconds(now) for s in phase_spans(history, final)}


def current_visit(history: list[PhaseVisit]) -> str | None:
    """The visit key of the phase the run is in now."""
    spans = phase_spans(history)
    return spans[-1].key if spans else None


def got_past(durations: dict[str, float], key: str) -> bool:
    """Whether a run with these durations got past start-up visit `key`: a later start-up
    visit began. A run that crashed or was stopped inside a visit would make it look fast."""
    if key not in START_SEQUENCE:
        return False
    later = START_SEQUENCE[START_SEQUENCE.index(key) + 1 :]
    return key in durations and any(k in durations for k in later)
