"""The agent's stdout: one JSON line per contract event, from any thread."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import BinaryIO

from trainer.contract.protocol import MAX_LINE_BYTES, Event, Log, Result


class Out:
    """Writes each event as one whole line (a lock, then one write and a flush), so the GPU
    thread, a kill in progress and the loop never interleave. Once the client is gone,
    everything after is dropped quietly: the agent ends when stdin closes."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream or sys.stdout.buffer
        self._lock = threading.Lock()
        self.closed = False

    def emit(self, event: Event) -> None:
        if not event.t:
            event.t = time.time()
        # default=str: a command's result may carry a value JSON has no type for (a Path).
        line = json.dumps(event.to_json(), separators=(",", ":"), default=str) + "\n"
        data = line.encode()
        if len(data) > MAX_LINE_BYTES:  # the monitor would refuse it: say so instead
            data = self._too_large(event, len(data))
        self.write_line(data)

    def write_line(self, data: bytes) -> None:
        """One line already made (an event of the samplers' process, sampler_process.py)."""
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed = True

    @staticmethod
    def _too_large(event: Event, size: int) -> bytes:
        why = f"{event.type} event of {size:,} bytes is over the {MAX_LINE_BYTES:,}-byte limit"
        small: Event = (
            Result(t=event.t, id=event.id, ok=False, error=f"answer too large: {why}")
            if isinstance(event, Result)
            else Log(t=event.t, level="error", message=f"dropped: {why}")
        )
        return (json.dumps(small.to_json(), separators=(",", ":")) + "\n").encode()
