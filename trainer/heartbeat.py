"""The heartbeat thread, and the two probes it reports: GIL pressure and per-thread CPU.

The heartbeat is written by its own thread, so a stuck training loop still has a fresh
`now` with an old `last_step_at`: the monitor can tell "stuck" from "dead".
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.contract.heartbeat import SCHEMA_VERSION as HEARTBEAT_SCHEMA
from trainer.fsutil import atomic_write_json
from trainer.runstate import RunState


class GilProbe(threading.Thread):
    """Sleeps `sleep_s` in a loop and records how late it wakes.

    A thread waking from sleep must take the GIL back; when other threads hold it (Python
    work in the pipeline threads), wake-ups are late. p99 lateness is GIL pressure in ms.
    """

    def __init__(self, state: RunState, stop: threading.Event, sleep_s: float = 0.005) -> None:
        super().__init__(name="gil-probe", daemon=True)
        self.state, self.stop, self.sleep_s = state, stop, sleep_s
        self._late: deque[float] = deque(maxlen=4096)
        self._lock = threading.Lock()

    def run(self) -> None:
        self.state.register_thread("probe", "cpu")
        self.state.thread_state("sleeping")
        while not self.stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            late = time.perf_counter() - t0 - self.sleep_s
            with self._lock:
                self._late.append(max(0.0, late))

    def drain(self) -> dict[str, Any]:
        with self._lock:
            samples = list(self._late)
            self._late.clear()
        if not samples:
            return {
                "probe_sleep_ms": self.sleep_s * 1e3,
                "p50_ms": 0.0,
                "p99_ms": 0.0,
                "samples": 0,
            }
        samples.sort()
        p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
        return {
            "probe_sleep_ms": self.sleep_s * 1e3,
            "p50_ms": statistics.median(samples) * 1e3,
            "p99_ms": p99 * 1e3,
            "samples": len(samples),
        }


class ThreadCpu:
    """Per-thread CPU % from /proc/self/task/<tid>/stat (utime + stime), between two calls."""

    def __init__(self) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._last: dict[int, tuple[float, int]] = {}

    def _cpu_ticks(self, tid: int) -> int | None:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            return None
        # The thread name (field 2) may contain spaces; fields after ')' are fixed.
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)

    def sample(self) -> dict[int, float]:
        """{native thread id: CPU %} for live Python threads."""
        now = time.monotonic()
        out: dict[int, float] = {}
        seen = set()
        for t in threading.enumerate():
            tid = t.native_id
            if tid is None:
                continue
            seen.add(tid)
            ticks = self._cpu_ticks(tid)
            if ticks is None:
                continue
            prev = self._last.get(tid)
            self._last[tid] = (now, ticks)
            if prev is not None and now > prev[0]:
                out[tid] = 100.0 * (ticks - prev[1]) / self._ticks / (now - prev[0])
        for tid in list(self._last):
            if tid not in seen:
                del self._last[tid]
        return out


class Heartbeat(threading.Thread):
    def __init__(
        self,
        path: Path,
        state: RunState,
        stop: threading.Event,
        interval_s: float,
        static: dict[str, Any],
        collect: Callable[[], dict[str, Any]],
    ) -> None:
        """`static`: fields fixed for the run; `collect`: live fields (queues, memory)."""
        super().__init__(name="heartbeat", daemon=True)
        self.path, self.state, self.stop, self.interval_s = path, state, stop, interval_s
        self.static, self.collect = static, collect
        self.gil = GilProbe(state, stop)
        self.cpu = ThreadCpu()
        self._write_lock = threading.Lock()
        self._poke = threading.Event()
        state.on_phase = self._poke.set  # a phase change is written at once, not up to 2 s late

    def start(self) -> None:
        self.gil.start()
        super().start()

    def run(self) -> None:
        self.state.register_thread("heartbeat", "cpu")
        self.state.thread_state("writing")
        while not self.stop.is_set():
            self._poke.wait(self.interval_s)
            self._poke.clear()
            if self.stop.is_set():
                break
            try:
                self.write()
            except Exception as e:  # a heartbeat failure must not kill training
                print(f"heartbeat: write failed: {e}", flush=True)

    def write(self) -> dict[str, Any]:
        """Build and write one heartbeat (also called directly for the final one)."""
        with self._write_lock:
            snap = self.state.snapshot()
            cpu = self.cpu.sample()
            idents = {t.ident: t.native_id for t in threading.enumerate()}
            for t in snap["threads"]:
                native = idents.get(t.pop("ident"))
                t["cpu_pct"] = round(cpu.get(native, 0.0), 1) if native else 0.0
            beat = {
                "schema": HEARTBEAT_SCHEMA,
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "host": socket.gethostname(),
                **self.static,
                **snap,
                **self.collect(),
                "gil": self.gil.drain(),
                "now": time.time(),
            }
            # No fsync: it is rewritten every interval; os.replace alone keeps it whole.
            atomic_write_json(self.path, beat, durable=False)
            return beat
