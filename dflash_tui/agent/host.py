"""The training host: how many CPUs the agent (and so the trainer beside it) may use, the load
on them, the host's CPU use, its memory and the free disk under the run root.

Linux's /proc gives CPU use and memory; os.getloadavg, os.sched_getaffinity and os.statvfs
the rest. Whatever a host does not offer is None in the sample, never an error: a sample
always goes out.
"""

from __future__ import annotations

import os

from trainer.contract.protocol import DiskSpace, HostSample


def cpu_count() -> int:
    """CPUs this process may run on: its affinity (a container's or taskset's cpuset) where
    the platform has one, else the host's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_times(text: str) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat's `cpu` line. Idle is idle + iowait;
    guest time is already counted in user and nice, so it is left out of the total."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                values = [
                    int(x) for x in fields[1:9]
                ]  # user nice system idle iowait irq softirq steal
            except ValueError:
                return None
            if len(values) < 4:
                return None
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            total = sum(values)
            return total - idle, total
    return None


def meminfo(text: str) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; None without both."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if "MemTotal" in found and "MemAvailable" in found:
        return found["MemTotal"], found["MemAvailable"]
    return None


def disk_space(path: str) -> DiskSpace | None:
    """Free and total bytes of the file system holding `path` (before the first run the run
    root may not exist yet: the nearest folder above it that does)."""
    here = os.path.abspath(path)
    while True:
        try:
            st = os.statvfs(here)
            return DiskSpace(
                path=here, free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize
            )
        except FileNotFoundError:
            parent = os.path.dirname(here)
            if parent == here:
                return None
            here = parent
        except OSError:
            return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


class HostProbe:
    """Samples the host; CPU use is over the time since the previous sample (or since the
    probe was made, for the first)."""

    def __init__(self, run_root: str) -> None:
        self.run_root = run_root
        self._last = self._cpu()

    @staticmethod
    def _cpu() -> tuple[int, int] | None:
        text = _read("/proc/stat")
        return cpu_times(text) if text is not None else None

    def sample(self) -> HostSample:
        now = self._cpu()
        pct = None
        if now is not None and self._last is not None and now[1] > self._last[1]:
            busy = (now[0] - self._last[0]) / (now[1] - self._last[1])
            pct = round(min(100.0, max(0.0, 100.0 * busy)), 1)
        self._last = now
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except (AttributeError, OSError):
            load = []  # unknown, not zero
        text = _read("/proc/meminfo")
        mem = meminfo(text) if text is not None else None
        return HostSample(
            cpus=cpu_count(),
            load=load,
            cpu_pct=pct,
            mem_total=mem[0] if mem else None,
            mem_available=min(mem) if mem else None,
            disk=disk_space(self.run_root),
        )
