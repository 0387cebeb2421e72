"""What the run is doing right now, shared by the worker threads and the heartbeat thread.

Workers write small facts (their state, the step, the phase); the heartbeat thread reads a
consistent copy under the lock, as the contract's record (trainer/contract/heartbeat.py).
Nothing here blocks for long or touches the GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

from trainer.contract.checkpoints import CheckpointFailure, CheckpointPlan
from trainer.contract.environment import Preflight
from trainer.contract.evaluation import EvalInfo
from trainer.contract.graphs import GraphInfo
from trainer.contract.heartbeat import (
    CheckpointInfo,
    CompileInfo,
    DataInfo,
    ErrorInfo,
    Heartbeat,
    PhaseProgress,
    Span,
    ThreadInfo,
    WandbInfo,
)
from trainer.contract.phases import COMPILING, PHASES, STARTING, PhaseVisit
from trainer.reporting.stages import StageClock

# phase_history keeps the start-up whole and the most recent visits: a long run goes through
# training <-> checkpointing thousands of times, and the heartbeat must stay small.
HISTORY_HEAD = 16
HISTORY_TAIL = 16


class RunState:
    def __init__(self, run_id: str, total_steps: int = 0) -> None:
        self._lock = threading.Lock()
        self.run_id = run_id
        self.started_at = time.time()
        self.phase = STARTING
        self.phase_started_at = self.started_at
        self.phase_progress: PhaseProgress | None = None
        self._history_head: list[PhaseVisit] = [PhaseVisit(STARTING, self.started_at, 1)]
        self._history_tail: deque[PhaseVisit] = deque(maxlen=HISTORY_TAIL)
        self._visits: dict[str, int] = {STARTING: 1}
        self.step = 0
        self.total_steps = total_steps
        self.last_step_at: float | None = None
        self.tokens = 0
        self.epoch = 0.0
        # (time, tokens, batch positions) per step: the positions count the padding too.
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=64)
        self.slots = 0
        self.data: DataInfo | None = None
        self._threads: dict[int, ThreadInfo] = {}  # keyed by threading.get_ident()
        self._clocks: dict[int, StageClock] = {}  # pipeline threads' stage times, same keys
        self.error: ErrorInfo | None = None
        self.wandb = WandbInfo(mode="disabled")
        self.compile = CompileInfo()
        self.target_load: Span | None = None
        self.last_checkpoint: CheckpointInfo | None = None
        # The checkpoints' forecast size, period and retention, and the newest failed save.
        self.checkpoints: CheckpointPlan | None = None
        self.exit_code: int | None = None
        self.preflight: Preflight | None = None  # set once, before the target loads
        # Replaced whole by the eval thread (evaluation/online.py).
        self.eval: EvalInfo | None = None
        # {place: its CUDA graphs}, each replaced whole by the thread that captures them.
        self.graphs: dict[str, GraphInfo] = {}
        # Called after a phase change, outside the lock (the heartbeat writes at once).
        self.on_phase: Callable[[], None] = lambda: None

    # -- phases ------------------------------------------------------------------------
    def set_phase(
        self, phase: str, total: int | None = None, unit: str = "", counted: bool = False
    ) -> None:
        """`counted`: the phase's progress is counted in `unit` even with no known `total`
        (compiling counts graphs before it knows how many there are)."""
        assert phase in PHASES, phase
        with self._lock:
            if phase == self.phase:
                if not (total or counted):
                    return
                # The same phase, its size known now (the data's lines once counted).
                self.phase_progress = PhaseProgress(0, total, unit)
            else:
                now = time.time()
                self.phase, self.phase_started_at = phase, now
                self.phase_progress = PhaseProgress(0, total, unit) if total or counted else None
                self._visits[phase] = self._visits.get(phase, 0) + 1
                last = self._history_tail or self._history_head
                last[-1] = dataclasses.replace(last[-1], ended_at=now)
                visit = PhaseVisit(phase, now, self._visits[phase])
                if len(self._history_head) < HISTORY_HEAD:
                    self._history_head.append(visit)
                else:
                    self._history_tail.append(visit)
        self.on_phase()

    def progress(self, done: int, unit: str | None = None) -> None:
        """`unit`: only the progress counted in that unit (the target loader's "target
        copies" finish during compiling, whose progress counts graphs)."""
        with self._lock:
            p = self.phase_progress
            if p is not None and (unit is None or p.unit == unit):
                p.done = done

    @property
    def phase_history(self) -> list[PhaseVisit]:
        with self._lock:
            return [*self._history_head, *self._history_tail]

    # -- work that overlaps the phases -------------------------------------------------
    def target_load_started(self) -> None:
        with self._lock:
            self.target_load = Span(time.time())

    def target_load_ended(self) -> None:
        with self._lock:
            if self.target_load is not None:
                self.target_load.ended_at = time.time()

    # -- compiling (trainer/runtime/compile/progress.py)
    def compile_expected(self, graphs: int | None, last_s: float | None, cache: str | None) -> None:
        """Then the compiling phase, which counts graphs: `graphs` expected (None: unknown,
        never compiled with this cache), and what they took the last time. One change, so
        the heartbeat written at the phase change already carries the count."""
        with self._lock:
            c = self.compile
            c.done, c.expected, c.last_s, c.last_cache = 0, graphs, last_s, cache
        self.set_phase(COMPILING, graphs, "graphs", counted=True)

    def compile_started(self, label: str) -> None:
        with self._lock:
            self.compile.current, self.compile.current_since = label, time.time()

    def compile_ended(self) -> None:
        with self._lock:
            c = self.compile
            c.done += 1
            c.current = c.current_since = None
            if self.phase_progress is not None and self.phase_progress.unit == "graphs":
                self.phase_progress.done = c.done

    def checkpoint_saved(self, step: int, path: str) -> None:
        with self._lock:
            self.last_checkpoint = CheckpointInfo(step, path, time.time())
            if self.checkpoints is not None:
                self.checkpoints = dataclasses.replace(self.checkpoints, failed=None)

    def checkpoint_plan(self, plan: CheckpointPlan) -> None:
        with self._lock:
            self.checkpoints = plan

    def checkpoint_failed(self, step: int, message: str) -> None:
        """A save that failed: said until a later one succeeds (the previous stays the
        resume point)."""
        failure = CheckpointFailure(step, message, time.time())
        with self._lock:
            plan = self.checkpoints or CheckpointPlan(forecast_bytes=0)
            self.checkpoints = dataclasses.replace(plan, failed=failure)

    # -- threads -----------------------------------------------------------------------
    def register_thread(self, role: str, device: str) -> None:
        t = threading.current_thread()
        with self._lock:
            self._threads[threading.get_ident()] = ThreadInfo(
                t.name, role, device, "starting", time.time(), ident=threading.get_ident()
            )

    def stage_clock(self, device: str) -> StageClock:
        """A stage clock for the calling thread; the heartbeat reports its medians."""
        clock = StageClock(device)
        with self._lock:
            self._clocks[threading.get_ident()] = clock
        return clock

    def stages_by_thread(self) -> dict[str, dict[str, float]]:
        """{thread name: its stage medians} for the threads that time their stages."""
        with self._lock:
            threads = self._threads
            pairs = [(threads[i].name, c) for i, c in self._clocks.items() if i in threads]
        return {name: ms for name, c in pairs if (ms := c.medians_ms())}

    def thread_state(self, state: str) -> None:
        info = self._threads.get(threading.get_ident())
        if info is not None and info.state != state:
            # Two attribute writes without the lock: a snapshot may pair the new state with
            # the old `since` for one heartbeat, which is harmless and keeps this path cheap.
            info.state, info.since = state, time.time()

    # -- steps -------------------------------------------------------------------------
    def record_step(self, step: int, tokens: int, epoch: float, slots: int = 0) -> None:
        """`tokens`, `slots`: running totals of real tokens and of batch positions."""
        now = time.time()
        with self._lock:
            self.step, self.last_step_at, self.epoch = step, now, epoch
            self.tokens, self.slots = tokens, slots
            self._recent.append((now, tokens, slots))

    def data_loaded(self, info: DataInfo) -> None:
        with self._lock:
            self.data = info

    def tok_s(self, window_s: float = 10.0) -> float:
        with self._lock:
            recent = list(self._recent)
        if len(recent) < 2:
            return 0.0
        now = recent[-1][0]
        inside = [r for r in recent if now - r[0] <= window_s]
        if len(inside) < 2:
            inside = recent[-2:]
        (t0, k0, _), (t1, k1, _) = inside[0], inside[-1]
        return (k1 - k0) / (t1 - t0) if t1 > t0 else 0.0

    def _padding(self) -> float | None:
        """Padding share of the recent steps' batch positions (under the lock)."""
        if len(self._recent) < 2:
            return None
        (_, k0, p0), (_, k1, p1) = self._recent[0], self._recent[-1]
        return 1 - (k1 - k0) / (p1 - p0) if p1 > p0 else None

    # -- failure -----------------------------------------------------------------------
    def fail(self, exc: BaseException) -> bool:
        """Record the first error only (later ones are usually its consequences)."""
        with self._lock:
            if self.error is not None:
                return False
            self.error = ErrorInfo(
                thread=threading.current_thread().name,
                message=f"{type(exc).__name__}: {exc}",
                traceback="".join(traceback.format_exception(exc)),
            )
            return True

    # -- snapshot ----------------------------------------------------------------------
    def heartbeat(self, process: Heartbeat) -> tuple[Heartbeat, list[int]]:
        """`process` (the fields that do not change: pid, host, code hash …) with this
        state's fields copied in under the lock, and each thread's `threading` ident, in
        the order of `threads` (the heartbeat thread maps them to CPU time)."""
        tok_s = self.tok_s()
        with self._lock:
            beat = dataclasses.replace(
                process,
                run_id=self.run_id,
                started_at=self.started_at,
                phase=self.phase,
                phase_started_at=self.phase_started_at,
                phase_progress=copy.copy(self.phase_progress),
                phase_history=[*self._history_head, *self._history_tail],
                step=self.step,
                total_steps=self.total_steps,
                last_step_at=self.last_step_at,
                tokens=self.tokens,
                epoch=self.epoch,
                tok_s=tok_s,
                threads=[
                    dataclasses.replace(t, stages_ms=self._clocks[i].medians_ms())
                    if i in self._clocks
                    else copy.copy(t)
                    for i, t in self._threads.items()
                ],
                error=self.error,
                wandb=copy.copy(self.wandb),
                compile=copy.deepcopy(self.compile),
                exit_code=self.exit_code,
                target_load=copy.copy(self.target_load),
                last_checkpoint=self.last_checkpoint,
                data=dataclasses.replace(self.data, padding=self._padding())
                if self.data is not None
                else None,
                preflight=self.preflight,
                eval=self.eval,
                graphs=dict(self.graphs),
                checkpoints=self.checkpoints,
            )
            return beat, list(self._threads)

    def set_eval(self, info: EvalInfo) -> None:
        with self._lock:
            self.eval = info

    def set_graphs(self, place: str, info: GraphInfo) -> None:
        """`info`: a copy the caller no longer changes (the heartbeat thread reads it)."""
        with self._lock:
            self.graphs[place] = info

    def roles(self) -> dict[int, str]:
        """{threading ident: "role@device (state)"} for the named stack dump."""
        with self._lock:
            return {i: f"{t.role}@{t.device} ({t.state})" for i, t in self._threads.items()}
