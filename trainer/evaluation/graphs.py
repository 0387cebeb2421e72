"""The held-out eval's decode step as a CUDA graph: captured once, replayed at every step.

Why: an eager verify step of the 8B target launches ~600 small kernels from Python; beside six
busy pipeline threads the eval thread gets little of the GIL to launch them, and a step took
344 ms (bench/README.md). A replay is one launch.

How, and why so:
  - warmed up first, then captured, on a side stream of the eval stream's priority (a capture
    needs a stream of its own; kernels keep the priority of the stream they were captured on);
  - `capture_error_mode="thread_local"`: the eval captures on its own thread while the
    training threads allocate and synchronize; under the default global mode their calls
    would break the capture;
  - `capture_begin`/`capture_end` rather than the `torch.cuda.graph` context, which
    synchronizes the whole device, collects garbage and empties the allocator's cache on
    entry: a stall for every training thread, and allocations to make again after it;
  - the step reads its inputs from buffers the caller fills before each replay, and writes
    into buffers that outlive it (trainer/evaluation/batched.py): nothing is captured that a
    replay would need to change.
A capture that fails (an operation a graph cannot hold, memory) is recorded with its reason
and that run goes on eagerly, the same function called directly; the next run tries again.
Never fatal. The counters are `GraphInfo` (trainer/contract/graphs.py), which the eval thread
publishes in the heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from trainer.config import bad_value, one_line
from trainer.contract.graphs import GraphInfo

WARMUP_CALLS = 2  # before a capture: lazy initialisations (cuBLAS, kernels) happen here


def check_cuda_graphs(setting: str, device: torch.device) -> None:
    """`eval.cuda_graphs` against the device the eval runs on: "on" needs CUDA (bad input,
    refused before anything loads)."""
    if setting == "on" and device.type != "cuda":
        rule = f"CUDA graphs need a CUDA device (the eval runs on {device}); use 'auto' or 'off'"
        raise bad_value("eval.cuda_graphs", setting, rule)


def graphs_off_reason(setting: str, device: torch.device) -> str | None:
    """Why the eval's step is not captured on `device` (None: it is)."""
    if setting == "off":
        return "eval.cuda_graphs = off"
    if device.type != "cuda":
        return f"the eval runs on {device}, not a CUDA device"
    return None


class GraphedStep:
    """A step function, captured at its first call of a run and replayed after; eager for
    the rest of a run whose capture failed. Its calls return the step's output tensor: a
    replay's is the same tensor each time, overwritten by the next replay."""

    def __init__(
        self, device: torch.device, info: GraphInfo, log: Callable[[str], None] = lambda _: None
    ) -> None:
        self.device, self.info, self.log = device, info, log
        self.fn: Callable[[], Tensor] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: Tensor | None = None
        self.eager_this_run = False

    def bind(self, fn: Callable[[], Tensor]) -> None:
        self.fn = fn

    def new_run(self) -> None:
        self.eager_this_run = False

    def __call__(self) -> Tensor:
        assert self.fn is not None, "GraphedStep.bind comes first"
        if self.graph is None and not self.eager_this_run and not self._capture(self.fn):
            self.eager_this_run = True
            self.info.eager_runs += 1
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        self.info.replays += 1
        assert self.output is not None
        return self.output

    def _capture(self, fn: Callable[[], Tensor]) -> bool:
        """Warm up and capture `fn`; False, the reason recorded and logged, when it failed.
        The warm-up calls run the step for real: it must give the same result when called
        again with the same inputs (the replay that follows)."""
        t0 = time.monotonic()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device, priority=current.priority)
        side.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        error: Exception | None = None
        output: Tensor | None = None
        with torch.cuda.stream(side):
            try:
                for _ in range(WARMUP_CALLS):
                    fn()
                graph.capture_begin(capture_error_mode="thread_local")
            except Exception as e:  # whatever breaks a capture: the step runs eagerly
                error = e
            else:
                try:
                    output = fn()
                except Exception as e:
                    error = e
                try:  # ends the capture even after a failure in it: the stream is usable again
                    graph.capture_end()
                except Exception as e:
                    error = error or e
        current.wait_stream(side)
        if error is not None or output is None:
            reason = one_line(f"{type(error).__name__}: {error}") if error else "no output"
            self.info.add_failure(time.time(), reason)
            self.log(f"eval: CUDA graph capture failed, this eval runs eagerly: {reason}")
            return False
        self.graph, self.output = graph, output
        self.info.captured += 1
        self.log(f"eval: decode step captured as a CUDA graph in {time.monotonic() - t0:.2f}s")
        return True
