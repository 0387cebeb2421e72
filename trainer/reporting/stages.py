"""Where each millisecond of a pipeline thread's loop goes: per-stage moving medians.

A thread calls `lap()` at the top of each iteration of its loop and wraps what it does in
`work(stage)` or `wait(stage)`. Each stage's time within one iteration is one sample, so the
medians add up to about one iteration (one batch for a target, one step for a drafter).

A CPU thread is timed by the wall clock. A thread that drives a GPU is timed on its stream,
by CUDA events read once they have completed (`Event.query`, never a sync): its Python runs
ahead of the GPU, so the host's clock would time kernel launches, not kernels. On the
stream, the time between two stages is a wait too (the stream had nothing to run): it is put
down to the queue or barrier the thread waited on in between ("wait q_hs": the drafter's
stream idle until the target's features were handed over), or to `host` when the thread
waited on nothing (the GPU waited for Python to launch work).

Stage names are the contract's (trainer/contract/heartbeat.py, `STAGE_*`).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from trainer.contract.heartbeat import STAGE_HOST
from trainer.reporting.profile_window import annotate

WINDOW = 32  # iterations behind each median
MAX_PENDING = 1024  # GPU stages not yet completed; past this the oldest are dropped


class StageClock:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        self._lock = threading.Lock()  # the heartbeat thread reads the medians
        self._samples: dict[str, deque[float]] = {}
        self._iteration = 0
        self._sums: dict[str, float] = {}  # the iteration being summed
        self._summing = 0  # which iteration `_sums` belongs to
        # GPU: (iteration, stage, start, end, gap) where gap = (stage the stream's idle time
        # before `start` is put down to, the previous stage's end event), None for the first.
        self._pending: deque[tuple[int, str, Any, Any, tuple[str, Any] | None]] = deque()
        self._last_end: Any = None
        self._waited: str | None = None  # the wait since the previous stage, if any

    # -- recording ----------------------------------------------------------------------
    def lap(self) -> None:
        """The top of the thread's loop: a new iteration begins."""
        if self.on_gpu:
            self.poll()
        else:
            self._flush()
        self._iteration += 1

    @contextlib.contextmanager
    def wait(self, stage: str) -> Iterator[None]:
        """Blocked on a queue or a barrier. On the GPU the stream's idle gap is measured at
        the next `work` instead; the host's wait only names it."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.on_gpu:
                self._waited = stage
            else:
                self._count(self._iteration, stage, (time.perf_counter() - t0) * 1e3)

    @contextlib.contextmanager
    def work(self, stage: str) -> Iterator[None]:
        """Work the thread does: on the GPU, what its stream runs between two events."""
        if not self.on_gpu:
            t0 = time.perf_counter()
            try:
                with annotate(threading.current_thread().name, stage):
                    yield
            finally:
                self._count(self._iteration, stage, (time.perf_counter() - t0) * 1e3)
            return
        stream = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        try:
            # DFLASH_PROFILE's window: the stage's launches under its name in the trace.
            with annotate(threading.current_thread().name, stage):
                yield
        finally:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            gap = None
            if self._last_end is not None:
                gap = (self._waited or STAGE_HOST, self._last_end)
            self._pending.append((self._iteration, stage, start, end, gap))
            self._last_end, self._waited = end, None
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()

    def poll(self) -> None:
        """Read the GPU stages that have completed, oldest first (one stream: in order)."""
        while self._pending:
            it, stage, start, end, gap = self._pending[0]
            if not end.query():
                return
            self._pending.popleft()
            if gap is not None:
                self._count(it, gap[0], max(0.0, gap[1].elapsed_time(start)))
            self._count(it, stage, start.elapsed_time(end))

    def _count(self, iteration: int, stage: str, ms: float) -> None:
        if iteration != self._summing:
            self._flush()
            self._summing = iteration
        self._sums[stage] = self._sums.get(stage, 0.0) + ms

    def _flush(self) -> None:
        """The iteration being summed is complete: one sample per stage it had."""
        if not self._sums:
            return
        with self._lock:
            for stage, ms in self._sums.items():
                self._samples.setdefault(stage, deque(maxlen=WINDOW)).append(ms)
        self._sums = {}

    # -- reading --------------------------------------------------------------------------
    def medians_ms(self) -> dict[str, float]:
        """{stage: median ms per iteration over the last WINDOW}, in the order first seen."""
        with self._lock:
            return {k: round(statistics.median(v), 3) for k, v in self._samples.items() if v}
