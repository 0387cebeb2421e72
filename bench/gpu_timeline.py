"""Where a GPU's time goes: clocks and power while a section runs, and kernel timelines.

Used by gpu_bench.py to explain the pipeline's efficiency. Three questions, three tools:
  - is the card slower when it runs longer (power or thermal limits)?  `GpuSampler`
  - does a stage run slower alone-but-sustained than in a short burst?  `sustained`
  - in the pipeline, is the GPU idle (gaps) or are kernels slower?     `KernelTimeline`
"""

from __future__ import annotations

import gzip
import shutil
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class GpuSampler:
    """NVML readings every 50 ms on a thread: SM clock, power, throttle reasons."""

    def __init__(self, index: int = 0, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.windows: dict[str, dict[str, float]] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # no NVML (CPU smoke runs): windows record nothing
            print(f"  (no NVML: {e}; clocks not sampled)", flush=True)
            self._nvml = None

    def _read(self) -> tuple[float, float, int]:
        n, h = self._nvml, self._handle
        reasons = n.nvmlDeviceGetCurrentClocksEventReasons(h)
        return (
            float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            int(reasons),
        )

    @contextmanager
    def window(self, label: str) -> Iterator[None]:
        if self._nvml is None:
            yield
            return
        samples: list[tuple[float, float, int]] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.period_s):
                samples.append(self._read())

        t = threading.Thread(target=loop, name=f"nvml-{label}", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()
            if samples:
                n = self._nvml
                power_capped = n.nvmlClocksEventReasonSwPowerCap | getattr(
                    n, "nvmlClocksEventReasonHwPowerBrakeSlowdown", 0
                )
                thermal = n.nvmlClocksEventReasonSwThermalSlowdown | getattr(
                    n, "nvmlClocksEventReasonHwThermalSlowdown", 0
                )
                self.windows[label] = {
                    "sm_clock_mhz": round(statistics.mean(s[0] for s in samples)),
                    "sm_clock_min_mhz": min(s[0] for s in samples),
                    "power_w": round(statistics.mean(s[1] for s in samples)),
                    "power_capped_share": round(
                        sum(1 for s in samples if s[2] & power_capped) / len(samples), 3
                    ),
                    "thermal_share": round(
                        sum(1 for s in samples if s[2] & thermal) / len(samples), 3
                    ),
                    "samples": len(samples),
                }


def sustained(fn: Callable[[], None], n: int, device: torch.device) -> float:
    """Seconds per call over n back-to-back calls, one sync at the end: what a stage keeps
    up for seconds, as in the pipeline (short CUDA-event bursts see boost clocks)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


class KernelTimeline:
    """A torch.profiler window; `summary()` splits its wall time into kernel time per CUDA
    stream, overlap between streams, and idle gaps."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=acts)
        self.t0 = self.t1 = 0.0

    def start(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.start()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t1 = time.perf_counter()
        self.prof.stop()

    def summary(self, steps: int) -> dict[str, Any]:
        """Per step, in ms: wall, busy (any kernel running), idle, kernel time per stream,
        and the ten most expensive kernels."""
        from torch.autograd import DeviceType

        events = [
            e
            for e in self.prof.profiler.kineto_results.events()  # type: ignore[union-attr]
            if e.device_type() == DeviceType.CUDA and e.duration_ns() > 0
        ]
        if not events:
            return {"steps": steps, "kernels": 0}
        spans = sorted((e.start_ns(), e.end_ns()) for e in events)
        start, end = spans[0][0], max(s[1] for s in spans)
        busy, cur_s, cur_e = 0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        per_stream: dict[int, int] = defaultdict(int)
        per_kernel: dict[str, int] = defaultdict(int)
        for e in events:
            per_stream[e.device_resource_id()] += e.duration_ns()
        for e in events:
            per_kernel[e.name()[:80]] += e.duration_ns()
        ms = 1e-6 / steps
        total = sum(per_stream.values())
        return {
            "steps": steps,
            "kernels": len(events),
            "wall_ms": (end - start) * ms,
            "busy_ms": busy * ms,
            "idle_ms": (end - start - busy) * ms,
            "kernel_sum_ms": total * ms,
            "overlap_ms": (total - busy) * ms,
            "per_stream_ms": {str(k): v * ms for k, v in sorted(per_stream.items())},
            "top_kernels_ms": {
                k: round(v * ms, 2)
                for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:10]
            },
        }

    def save(self, path: Path) -> None:
        """The Chrome trace, gzipped (open in Perfetto)."""
        raw = path.with_suffix("")
        self.prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
