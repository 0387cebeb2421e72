"""What the followed run is compared with: facts from earlier runs, computed in one place.

Rules (dflash_tui/diagnosis/) and panes (dflash_tui/widgets/) call these; nothing else
recomputes them, so the GPU pane and `memory_short` cannot disagree on what a role should
hold, nor the heartbeat pane and `slow_phase` on how long a phase took last time.

- `earlier_runs`: the earlier runs a comparison may use: created before the followed run
  and `comparable` with it (trainer/contract/comparable.py: same work, same hardware).
- `expected_memory`: per role, the median peak of those runs that trained.
- `phase_comparison`: the current visit against the same visit key of those runs that got
  past it; the wait for the target's weights (`loading_target#2`) as whole loads.
- `run_outcome`: how a listed run ended, in the contract's words (trainer/contract/outcomes.py).
- `faster_environment`: the last earlier comparable run that trained faster than a rate, and
  what differs between its environment and this run's (trainer/contract/environment.py).
- `earlier_best_tau`: the best held-out τ of those runs that evaluated with the same
  settings (held-out samples, prompts, new tokens, data: `RunEval.settings`); τ from other
  prompts or another decode length measures something else.

The GPU that a thread or role runs on is the store's (`Store.gpu_index`, `Store.gpu_roles`).
"""

from __future__ import annotations

import dataclasses
import statistics

from dflash_tui.fmt import duration
from dflash_tui.state import Store
from trainer.contract.comparable import comparable
from trainer.contract.evaluation import EvalPoint
from trainer.contract.heartbeat import Heartbeat
from trainer.contract.outcomes import Outcome, outcome_of
from trainer.contract.phases import (
    DOING,
    LOADING_TARGET,
    TARGET_WAIT,
    TOOK,
    TRAINING,
    got_past,
    phase_spans,
)
from trainer.contract.protocol import RunInfo


@dataclasses.dataclass(frozen=True)
class Earlier:
    """A figure from earlier comparable runs: (run id, value) oldest first."""

    values: tuple[tuple[str, float], ...]

    @property
    def usual(self) -> float:
        """The median: one odd run does not set the bar."""
        return float(statistics.median(v for _, v in self.values))

    @property
    def last_run(self) -> str:
        return self.values[-1][0]

    @property
    def last(self) -> float:
        return self.values[-1][1]

    @property
    def runs(self) -> list[str]:
        return [r for r, _ in self.values]


def earlier_runs(s: Store) -> list[RunInfo]:
    """Runs created before the followed one and comparable with it, oldest first."""
    cur = s.current_run()
    if cur is None or cur.signature is None:
        return []
    out = [
        r
        for r in s.runs
        if r.run_id != cur.run_id
        and r.created < cur.created
        and comparable(cur.signature, r.signature)
    ]
    return sorted(out, key=lambda r: r.created)


def expected_memory(s: Store) -> dict[str, Earlier]:
    """{role: peak bytes}: the median over earlier comparable runs that trained (a run that
    stopped before training never reached its peak)."""
    peaks: dict[str, list[tuple[str, float]]] = {}
    for r in earlier_runs(s):
        if TRAINING not in r.phases:
            continue
        for role, peak in r.role_memory.items():
            if peak > 0:
                peaks.setdefault(role, []).append((r.run_id, float(peak)))
    return {role: Earlier(tuple(v)) for role, v in peaks.items()}


def current_visit(hb: Heartbeat) -> str:
    """The visit key of the phase the run is in: from the history, when it agrees with the
    phase (a heartbeat without history is in the first visit of its phase)."""
    key = hb.visit
    return key if key is not None and key.split("#")[0] == hb.phase else hb.phase


def target_load_so_far(hb: Heartbeat, now: float) -> float | None:
    """Seconds since the target's weights began to load (its span, or for schema 1 the first
    loading_target visit); the whole load once it is over."""
    if hb.target_load is not None:
        return hb.target_load.seconds(now)
    first = next((v for v in phase_spans(hb.phase_history) if v.key == LOADING_TARGET), None)
    return None if first is None else max(0.0, now - first.started_at)


@dataclasses.dataclass(frozen=True)
class PhaseComparison:
    key: str  # the visit key: "compiling", "loading_target#2"
    so_far: float | None  # this run's figure: seconds in the visit, or into the whole load
    earlier: Earlier

    def expectation(self) -> str:
        """For the heartbeat pane: "compile took 4m12s last time"."""
        return f"{TOOK[self.key]} took {duration(max(0.0, self.earlier.last))} last time"

    @property
    def doing(self) -> str:
        return DOING[self.key]


def phase_comparison(s: Store, now: float | None = None) -> PhaseComparison | None:
    """The current visit against the same visit of earlier comparable runs that got past it.
    The wait for weights is compared as whole loads: this run's load so far against earlier
    runs' `target_load_s` (the load overlaps compiling: its visits alone say little)."""
    hb = s.heartbeat
    if hb is None:
        return None
    key = current_visit(hb)
    if key not in TOOK:
        return None
    t = s.remote_now(now)
    past: list[tuple[str, float]] = []
    if key == TARGET_WAIT:
        so_far = target_load_so_far(hb, t)
        for r in earlier_runs(s):
            if r.target_load_s is not None:
                past.append((r.run_id, r.target_load_s))
    else:
        so_far = t - hb.phase_started_at if hb.phase_started_at else None
        for r in earlier_runs(s):
            if got_past(r.phases, key):
                past.append((r.run_id, r.phases[key]))
    return PhaseComparison(key, so_far, Earlier(tuple(past))) if past else None


def phase_expectation(s: Store, now: float | None = None) -> str | None:
    """What the current visit took in the last earlier comparable run, for the heartbeat
    pane: "compile took 4m12s last time". None when there is nothing to compare with."""
    got = phase_comparison(s, now)
    return got.expectation() if got else None


@dataclasses.dataclass(frozen=True)
class EnvironmentChange:
    run: RunInfo  # the earlier, faster run
    tok_s: float  # its best logged tok/s
    differences: list[str]  # "transformers 5.17.0 → 5.24.0", "fla missing"


def faster_environment(s: Store, tok_s: float, factor: float) -> EnvironmentChange | None:
    """The last earlier comparable run whose best tok/s beat `tok_s` × `factor`, when its
    environment differs from the followed run's. None when either has no environment
    (a trainer from before the fingerprint) or nothing differs."""
    cur = s.current_run()
    if cur is None or cur.environment is None:
        return None
    for r in reversed(earlier_runs(s)):
        if r.best_tok_s is None or r.best_tok_s <= tok_s * factor:
            continue
        if r.environment is None:
            return None
        diffs = cur.environment.differences(r.environment)
        return EnvironmentChange(r, r.best_tok_s, diffs) if diffs else None
    return None


@dataclasses.dataclass(frozen=True)
class EarlierTau:
    run_id: str  # the earlier run whose held-out τ was the best
    point: EvalPoint  # that run's best eval (its step, τ and training acc then)

    @property
    def tau(self) -> float:
        return self.point.tau or 0.0


def earlier_best_tau(s: Store) -> EarlierTau | None:
    """The best held-out τ of the earlier comparable runs whose evals had this run's
    settings (`RunEval.settings`, from the runs list: the current run's own entry says its
    settings). None when this run evaluates nothing or no such run evaluated."""
    cur = s.current_run()
    if cur is None or cur.eval is None:
        return None
    best: EarlierTau | None = None
    for r in earlier_runs(s):
        if r.eval is None or r.eval.best is None or r.eval.settings() != cur.eval.settings():
            continue
        if best is None or (r.eval.best.tau or 0.0) > best.tau:
            best = EarlierTau(r.run_id, r.eval.best)
    return best


def run_outcome(run: RunInfo) -> Outcome:
    """How a listed run ended: the agent's `outcome`, settled from the run's files. An agent
    of protocol 1 sends none: then the contract's rule on what the list has (the exit record,
    the last phase and step), which cannot tell a schema-1 stop from a finish."""
    if run.outcome is not None:
        return run.outcome
    hb = None
    if run.phase is not None:
        hb = Heartbeat(
            schema=1,
            run_id=run.run_id,
            pid=0,
            host="",
            now=0.0,
            phase=run.phase,
            step=run.step or 0,
        )
    return outcome_of(run.alive, hb, run.exit)
