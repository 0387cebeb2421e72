"""The human step line and the JSONL metrics stream of a run dir.

The step line keeps the exact shape operators already grep:

[479m] step=876 loss=1.3377 acc=0.120 streak=1.5 lr=4.40e-04 noise=0.0366 | tgt=0.35b/s \
dft=0.35b/s (14.2Ktok/s) | q_pre=[50, 16, 2, 1, 10] q_hs=[60] | epoch~0.17 ETA=11.4d

Both files are appended line by line and flushed at once: a live run never looks dead
because its output sits in a buffer.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def format_tokens_rate(tok_s: float) -> str:
    if tok_s >= 1e6:
        return f"{tok_s / 1e6:.1f}M"
    if tok_s >= 1e3:
        return f"{tok_s / 1e3:.1f}K"
    return f"{tok_s:.0f}"


@dataclass
class StepRecord:
    """Every field of a step line; `metrics.jsonl` carries these plus memory and totals."""

    elapsed_s: float
    step: int
    loss: float
    acc: float
    streak: float
    lr: float
    noise: float
    tgt_bps: float
    dft_bps: float
    tok_s: float
    q_pre: list[int]
    q_hs: list[int]
    epoch: float
    eta_s: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"[{int(self.elapsed_s // 60)}m] step={self.step} loss={self.loss:.4f} "
            f"acc={self.acc:.3f} streak={self.streak:.1f} lr={self.lr:.2e} "
            f"noise={self.noise:.4f} | tgt={self.tgt_bps:.2f}b/s dft={self.dft_bps:.2f}b/s "
            f"({format_tokens_rate(self.tok_s)}tok/s) | q_pre={self.q_pre} q_hs={self.q_hs} "
            f"| epoch~{self.epoch:.2f} ETA={format_eta(self.eta_s)}"
        )

    def to_json(self, now: float) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        d["time"] = now
        return d


def _same_file(a: TextIO, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):
        return False


class RunLog:
    """Appends to train.log and metrics.jsonl, and echoes step lines to stdout.

    When stdout *is* train.log (a launcher redirected it there), lines go through stdout
    alone: one writer, so lines from other threads' prints never interleave mid-line and
    nothing is written twice."""

    def __init__(self, run_dir: Path, echo: bool = True) -> None:
        self.train_log_path = run_dir / "train.log"
        self.metrics_path = run_dir / "metrics.jsonl"
        self._lock = threading.Lock()
        self._own_log = not _same_file(sys.stdout, self.train_log_path)
        # Line-buffered, and flushed explicitly too: correct even if someone swaps buffering.
        self._log: TextIO = (
            open(self.train_log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            if self._own_log
            else sys.stdout
        )
        self._metrics = open(self.metrics_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._echo = echo and self._own_log

    def line(self, text: str) -> None:
        with self._lock:
            self._log.write(text + "\n")
            self._log.flush()
            if self._echo:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()

    def warn(self, text: str) -> None:
        self.line(f"WARNING: {text}")

    def record(self, rec: StepRecord, now: float) -> None:
        with self._lock:
            self._metrics.write(json.dumps(rec.to_json(now), sort_keys=True) + "\n")
            self._metrics.flush()
        self.line(rec.line())

    def close(self) -> None:
        with self._lock:
            if self._own_log:
                self._log.close()
            self._metrics.close()
