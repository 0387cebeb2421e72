"""The agent's stdout: one JSON line per contract event, from any thread."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import BinaryIO

from trainer.contract.protocol import Event


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
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed = True
