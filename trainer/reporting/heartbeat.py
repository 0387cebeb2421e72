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
from dataclasses import dataclass, field
from pathlib import Path

from trainer.contract.heartbeat import (
    SCHEMA_VERSION,
    DeviceId,
    DeviceMemory,
    GilProbe,
    Heartbeat,
    Queues,
)
from trainer.contract.records import HEARTBEAT, TELEMETRY
from trainer.contract.telemetry import TelemetryWriter
from trainer.fsutil import atomic_write_json
from trainer.reporting.runstate import RunState


class GilProbeThread(threading.Thread):
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

    def drain(self) -> GilProbe:
        with self._lock:
            samples = list(self._late)
            self._late.clear()
        if not samples:
            return GilProbe(probe_sleep_ms=self.sleep_s * 1e3)
        samples.sort()
        p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
        return GilProbe(
            probe_sleep_ms=self.sleep_s * 1e3,
            p50_ms=statistics.median(samples) * 1e3,
            p99_ms=p99 * 1e3,
            samples=len(samples),
        )


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


def proc_start_ticks(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the
    pid it names one process, whatever reuses the pid after it exits."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class LiveFields:
    """What only the pipeline and the devices know: filled by the run on each beat."""

    queues: Queues = field(default_factory=Queues)
    memory: dict[str, DeviceMemory] = field(default_factory=dict)
    devices: dict[str, DeviceId] = field(default_factory=dict)


class HeartbeatWriter(threading.Thread):
    def __init__(
        self,
        run_dir: Path,
        state: RunState,
        stop: threading.Event,
        interval_s: float,
        code_sha256: str,
        collect: Callable[[], LiveFields],
    ) -> None:
        """`collect`: the live fields (queues, memory, devices), asked on every beat."""
        super().__init__(name="heartbeat", daemon=True)
        self.path = run_dir / HEARTBEAT
        self.state, self.stop, self.interval_s = state, stop, interval_s
        self.collect = collect
        self.telemetry = TelemetryWriter(run_dir / TELEMETRY)
        self.gil = GilProbeThread(state, stop)
        self.cpu = ThreadCpu()
        # What does not change for the life of the process; the run state adds the rest.
        self.process = Heartbeat(
            schema=SCHEMA_VERSION,
            run_id=state.run_id,
            pid=os.getpid(),
            pgid=os.getpgid(0),
            host=socket.gethostname(),
            now=0.0,
            phase=state.phase,
            code_sha256=code_sha256,
            proc_start=proc_start_ticks(),
        )
        self._write_lock = threading.Lock()
        # Called with each heartbeat written and whether it is the final one: processes mode
        # writes the rank's own heartbeat-rank{R}.json from it (trainer/distributed/run.py).
        self.also: Callable[[Heartbeat, bool], None] = lambda _beat, _final: None
        # Called before each heartbeat is built, with whether it is the final one: the
        # processes-mode writer puts the other hosts' ranks into `process` from it.
        self.before: Callable[[bool], None] = lambda _final: None
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

    def build(self) -> Heartbeat:
        beat, idents = self.state.heartbeat(self.process)
        cpu = self.cpu.sample()
        natives = {t.ident: t.native_id for t in threading.enumerate()}
        for ident, info in zip(idents, beat.threads, strict=True):
            native = natives.get(ident)
            info.cpu_pct = round(cpu.get(native, 0.0), 1) if native else 0.0
        live = self.collect()
        beat.queues, beat.memory, beat.devices = live.queues, live.memory, live.devices
        beat.gil, beat.now = self.gil.drain(), time.time()
        return beat

    def write(self, final: bool = False) -> Heartbeat:
        """Build and write one heartbeat (also called directly for the first and the final
        one); every TELEMETRY_INTERVAL_S, and always for a final one, the history too."""
        with self._write_lock:
            self.before(final)
            beat = self.build()
            data = beat.to_json()
            # No fsync: it is rewritten every interval; os.replace alone keeps it whole.
            atomic_write_json(self.path, data, durable=False)
            self.telemetry.append(data, force=final)
            self.also(beat, final)
            return beat
