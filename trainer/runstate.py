"""What the run is doing right now, shared by the worker threads and the heartbeat thread.

Workers write small facts (their state, the step, the phase); the heartbeat thread reads a
consistent snapshot under the lock. Nothing here blocks for long or touches the GPU.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.contract.phases import PHASES


@dataclass
class ThreadInfo:
    name: str
    role: str
    device: str
    state: str = "starting"
    since: float = field(default_factory=time.time)


class RunState:
    def __init__(self, run_id: str, total_steps: int = 0) -> None:
        self._lock = threading.Lock()
        self.run_id = run_id
        self.started_at = time.time()
        self.phase = "starting"
        self.phase_started_at = self.started_at
        self.phase_progress: dict[str, Any] | None = None
        self.phase_history: list[dict[str, Any]] = [
            {"phase": "starting", "started_at": self.started_at}
        ]
        self.step = 0
        self.total_steps = total_steps
        self.last_step_at: float | None = None
        self.tokens = 0
        self.epoch = 0.0
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)  # (time, tokens) per step
        self.threads: dict[int, ThreadInfo] = {}  # keyed by threading.get_ident()
        self.error: dict[str, str] | None = None
        self.wandb: dict[str, Any] = {"mode": "disabled", "id": None, "url": None}
        self.compile: dict[str, Any] = {
            "graphs": 0,
            "recompiles": 0,
            "warmup_s": None,
            "cache_dir": "",
        }
        self.exit_code: int | None = None
        # Called after a phase change, outside the lock (the heartbeat writes at once).
        self.on_phase: Callable[[], None] = lambda: None

    # -- phases ------------------------------------------------------------------------
    def set_phase(self, phase: str, total: int | None = None, unit: str = "") -> None:
        assert phase in PHASES, phase
        with self._lock:
            if phase == self.phase:
                return
            now = time.time()
            self.phase, self.phase_started_at = phase, now
            self.phase_progress = {"done": 0, "total": total, "unit": unit} if total else None
            self.phase_history.append({"phase": phase, "started_at": now})
        self.on_phase()

    def progress(self, done: int) -> None:
        with self._lock:
            if self.phase_progress is not None:
                self.phase_progress["done"] = done

    # -- threads -----------------------------------------------------------------------
    def register_thread(self, role: str, device: str) -> None:
        t = threading.current_thread()
        with self._lock:
            self.threads[threading.get_ident()] = ThreadInfo(t.name, role, device)

    def thread_state(self, state: str) -> None:
        info = self.threads.get(threading.get_ident())
        if info is not None and info.state != state:
            info.state, info.since = state, time.time()

    # -- steps -------------------------------------------------------------------------
    def record_step(self, step: int, tokens: int, epoch: float) -> None:
        now = time.time()
        with self._lock:
            self.step, self.last_step_at, self.epoch = step, now, epoch
            self.tokens = tokens
            self._recent.append((now, tokens))

    def tok_s(self, window_s: float = 10.0) -> float:
        with self._lock:
            recent = list(self._recent)
        if len(recent) < 2:
            return 0.0
        now = recent[-1][0]
        inside = [r for r in recent if now - r[0] <= window_s] or recent[-2:]
        if len(inside) < 2:
            inside = recent[-2:]
        (t0, k0), (t1, k1) = inside[0], inside[-1]
        return (k1 - k0) / (t1 - t0) if t1 > t0 else 0.0

    # -- failure -----------------------------------------------------------------------
    def fail(self, exc: BaseException) -> bool:
        """Record the first error only (later ones are usually its consequences)."""
        with self._lock:
            if self.error is not None:
                return False
            self.error = {
                "thread": threading.current_thread().name,
                "message": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc)),
            }
            return True

    # -- snapshot ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            threads = [
                {
                    "name": i.name,
                    "role": i.role,
                    "device": i.device,
                    "state": i.state,
                    "since": i.since,
                    "ident": ident,
                }
                for ident, i in self.threads.items()
            ]
            snap = {
                "run_id": self.run_id,
                "started_at": self.started_at,
                "phase": self.phase,
                "phase_started_at": self.phase_started_at,
                "phase_progress": dict(self.phase_progress) if self.phase_progress else None,
                "phase_history": list(self.phase_history),
                "step": self.step,
                "total_steps": self.total_steps,
                "last_step_at": self.last_step_at,
                "tokens": self.tokens,
                "epoch": self.epoch,
                "threads": threads,
                "error": dict(self.error) if self.error else None,
                "wandb": dict(self.wandb),
                "compile": dict(self.compile),
                "exit_code": self.exit_code,
            }
        snap["tok_s"] = self.tok_s()
        return snap
