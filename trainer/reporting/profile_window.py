"""`DFLASH_PROFILE=START:STEPS`: a torch.profiler window over a running pipeline's steps.

Where every millisecond of a steady period goes can only be read from the GPU's own
timeline, and a launched run is the one to read it from (a harness is not the operator's
path). With the variable set, the optimizer step that ends step START starts the profiler
(CUDA kernels and memory copies, and every thread's CPU ops where this torch can record
them), and the one that ends step START + STEPS stops it and writes the Chrome trace into
the run dir as `profile/steps-A-B.json.gz`; train.log says when it started and where the
trace went. While the window is open each pipeline stage is a named range
(`stage:THREAD:STAGE`, `annotate`), so each kernel can be put down to the stage whose
thread launched it. `bench/profile_report.py` reads the trace: per stream, kernel classes
(GEMMs, attention, elementwise, optimizer, copies) per stage, overlap and idle time.

A developer's switch, like DFLASH_FAULT: a value that is not START:STEPS is said in
train.log and nothing is profiled. The window costs the profiled steps some host time (the
export blocks the stopping thread for a few seconds); the steps around it are not affected.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ENV = "DFLASH_PROFILE"
_open = threading.Event()  # a window is recording: stages are annotated


def parse(spec: str) -> tuple[int, int]:
    """'START:STEPS' -> (start, steps); a ValueError naming what is wrong otherwise."""
    start_s, sep, steps_s = spec.partition(":")
    if not sep:
        raise ValueError(f"{ENV}={spec!r}: expected START:STEPS (e.g. 150:4)")
    try:
        start, steps = int(start_s), int(steps_s)
    except ValueError:
        raise ValueError(f"{ENV}={spec!r}: START and STEPS must be integers") from None
    if start < 1 or steps < 1:
        raise ValueError(f"{ENV}={spec!r}: START and STEPS must be at least 1")
    return start, steps


@contextlib.contextmanager
def annotate(thread: str, stage: str) -> Iterator[None]:
    """A named range around one stage of a pipeline thread, only while a window records."""
    if not _open.is_set():
        yield
        return
    with torch.profiler.record_function(f"stage:{thread}:{stage}"):
        yield


def _profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    try:  # every thread's ops, not only the one that starts the window (torch >= 2.6)
        from torch._C._profiler import _ExperimentalConfig

        return profile(
            activities=acts,
            record_shapes=True,
            experimental_config=_ExperimentalConfig(profile_all_threads=True),
        )
    except (ImportError, TypeError):
        return profile(activities=acts, record_shapes=True)


class ProfileWindow:
    """The window of one run; `after_step` is called by the optimizer step's thread."""

    def __init__(self, start: int, steps: int, run_dir: Path, say: Callable[[str], None]):
        self.start, self.end = start, start + steps
        self.run_dir, self.say = run_dir, say
        self._prof: Any = None
        self._t0 = 0.0

    @classmethod
    def from_env(cls, run_dir: Path, say: Callable[[str], None]) -> ProfileWindow | None:
        spec = os.environ.get(ENV, "")
        if not spec:
            return None
        try:
            start, steps = parse(spec)
        except ValueError as e:
            say(f"profile: {e}; not profiling")
            return None
        return cls(start, steps, run_dir, say)

    def after_step(self, step: int) -> None:
        if step == self.start and self._prof is None:
            self._prof = _profiler()
            self._prof.start()
            _open.set()
            self._t0 = time.monotonic()
            self.say(f"profile: recording steps {self.start + 1}-{self.end}")
        elif step == self.end and self._prof is not None:
            _open.clear()
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the window's kernels are all in the trace
            wall = time.monotonic() - self._t0
            self._prof.stop()
            path = self.save()
            self._prof = None
            self.say(
                f"profile: steps {self.start + 1}-{self.end} took {wall:.2f}s, trace in "
                f"{path.relative_to(self.run_dir)}"
            )

    def save(self) -> Path:
        out = self.run_dir / "profile"
        out.mkdir(exist_ok=True)
        path = out / f"steps-{self.start + 1}-{self.end}.json.gz"
        raw = path.with_suffix("")
        self._prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        return path
