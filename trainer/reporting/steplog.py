"""The human step log (train.log) and the JSONL metrics stream (metrics.jsonl) of a run dir.

The step line's shape is the contract's (trainer/contract/steplines.py: formatter and parser
side by side). Both files are appended line by line and flushed at once: a live run never
looks dead because its output sits in a buffer.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import TextIO

from trainer.contract.records import METRICS, TRAIN_LOG, MetricsRow


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
        self.train_log_path = run_dir / TRAIN_LOG
        self.metrics_path = run_dir / METRICS
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
        self._flush_lines = True

    def buffer_in_blocks(self, size: int) -> None:
        """DFLASH_FAULT=buffer_log:BYTES: train.log in blocks of `size` bytes, as a redirected
        stdout without -u writes it (metrics.jsonl stays line by line)."""
        with self._lock:
            if self._own_log:
                self._log.close()
                raw = io.FileIO(self.train_log_path, "a")
            else:  # stdout is train.log (and unbuffered, under -u): our own buffered writer
                raw = io.FileIO(os.dup(sys.stdout.fileno()), "w")
                self._own_log = True  # close() closes it, flushing what is left
            # write_through: the text layer hands each line on, so blocks are `size` bytes
            # exactly (its own 8 KB chunking would double them)
            buffered = io.BufferedWriter(raw, buffer_size=size)
            self._log = io.TextIOWrapper(buffered, encoding="utf-8", write_through=True)
            self._flush_lines = False

    def line(self, text: str) -> None:
        with self._lock:
            self._log.write(text + "\n")
            if self._flush_lines:
                self._log.flush()
            if self._echo:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()

    def warn(self, text: str) -> None:
        self.line(f"WARNING: {text}")

    def record(self, row: MetricsRow) -> None:
        with self._lock:
            self._metrics.write(json.dumps(row.to_json(), sort_keys=True) + "\n")
            self._metrics.flush()
        self.line(row.step_line().format())

    def close(self) -> None:
        with self._lock:
            if self._own_log:
                self._log.close()
            self._metrics.close()
