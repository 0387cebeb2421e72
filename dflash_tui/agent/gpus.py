"""GPU samples: NVML through pynvml when importable, else nvidia-smi, else a clear no_gpu."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from typing import Any

from dflash_tui.agent.procs import command_of, proc_start, user_of
from trainer.contract.protocol import MAX_GPU_COMMAND, GpuDevice, GpuProcess

MIB = 1 << 20


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_local(pid: int) -> bool:
    # Inside a container NVML may report host pids, which do not exist here.
    return os.path.exists(f"/proc/{pid}")


class Owners:
    """Who runs a GPU process and what, read from /proc once per process: kept by pid and
    start time (a reused pid is another process), forgotten once NVML no longer lists it."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[int | None, str, str]] = {}
        self.seen: set[int] = set()
        self.lock = threading.Lock()  # the sampler's thread and a command's (kill, gpu_reset)

    def process(self, pid: int, mem_used: int) -> GpuProcess:
        if not _is_local(pid):
            return GpuProcess(pid=pid, mem_used=mem_used, local=False)
        start = proc_start(pid)
        with self.lock:
            self.seen.add(pid)
            known = self.known.get(pid)
        if known is None or known[0] != start:
            known = (start, user_of(pid), command_of(pid, MAX_GPU_COMMAND))
            with self.lock:
                self.known[pid] = known
        return GpuProcess(pid=pid, mem_used=mem_used, user=known[1], command=known[2])

    def sweep(self) -> None:
        """After a sample: forget the pids it did not list."""
        with self.lock:
            self.known = {pid: v for pid, v in self.known.items() if pid in self.seen}
            self.seen = set()


class Gpus:
    SMI_GPU = (
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw,"
        "temperature.gpu"
    )
    SMI_APPS = "--query-compute-apps=pid,used_memory,gpu_uuid"

    def __init__(self) -> None:
        self.backend = "none"
        self.reason = ""
        self.nvml: Any = None
        # Each GPU's PCI address as last read: a GPU NVML has lost keeps the address its
        # kernel log's Xid lines name it by.
        self.pci: dict[int, str] = {}
        self.owners = Owners()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.backend = pynvml, "nvml"
            return
        except Exception as e:  # ImportError, NVMLError (no driver), anything odd
            self.reason = f"NVML: {e}"
        if shutil.which("nvidia-smi"):
            try:
                self._smi()
                self.backend = "nvidia-smi"
                return
            except Exception as e:
                first = (str(e).strip().splitlines() or ["failed"])[0]
                self.reason += f"; nvidia-smi: {first}"
        else:
            self.reason += "; nvidia-smi: not found"

    def sample(self) -> list[GpuDevice]:
        if self.backend == "nvml":
            devices = self._nvml()
        elif self.backend == "nvidia-smi":
            devices = self._smi()
        else:
            return []
        self.owners.sweep()
        return devices

    def _nvml(self) -> list[GpuDevice]:
        n = self.nvml
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                mem = n.nvmlDeviceGetMemoryInfo(h)
                dev = GpuDevice(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    name=_text(n.nvmlDeviceGetName(h)),
                    mem_used=int(mem.used),
                    mem_total=int(mem.total),
                )
            except n.NVMLError as e:
                # One wedged board ("GPU is lost") must not cost the others their sample.
                error = str(e) or type(e).__name__
                out.append(GpuDevice(index=i, error=error, pci_bus_id=self.pci.get(i, "")))
                continue
            with contextlib.suppress(Exception):
                dev.pci_bus_id = self.pci[i] = _text(n.nvmlDeviceGetPciInfo(h).busId)
            # Each reading may be unsupported on a given board: a missing one stays None.
            with contextlib.suppress(Exception):
                dev.util = int(n.nvmlDeviceGetUtilizationRates(h).gpu)
            with contextlib.suppress(Exception):
                dev.power_w = n.nvmlDeviceGetPowerUsage(h) / 1000.0
            with contextlib.suppress(Exception):
                dev.temp_c = int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
            self._health(h, dev)
            with contextlib.suppress(Exception):
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    dev.processes.append(self.owners.process(int(p.pid), int(p.usedGpuMemory or 0)))
            out.append(dev)
        return out

    def _health(self, h: Any, dev: GpuDevice) -> None:
        """Clocks, their throttle reasons, ECC, the power limit: five calls, each left None
        where NVML says NOT_SUPPORTED (ECC off, a consumer board) or an older pynvml or
        driver lacks the function (AttributeError, FUNCTION_NOT_FOUND)."""
        n = self.nvml
        sm = getattr(n, "NVML_CLOCK_SM", 1)
        with contextlib.suppress(Exception):
            dev.sm_clock_mhz = int(n.nvmlDeviceGetClockInfo(h, sm))
        with contextlib.suppress(Exception):
            dev.sm_clock_max_mhz = int(n.nvmlDeviceGetMaxClockInfo(h, sm))
        # The "event" name since driver 535; the deprecated "throttle" one before it.
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            try:
                dev.clock_reasons = int(getattr(n, name)(h))
                break
            except Exception:
                continue
        with contextlib.suppress(Exception):
            dev.ecc_uncorrected = int(
                n.nvmlDeviceGetTotalEccErrors(
                    h,
                    getattr(n, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                    getattr(n, "NVML_VOLATILE_ECC", 0),
                )
            )
        with contextlib.suppress(Exception):
            dev.power_limit_w = n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0

    def _smi(self) -> list[GpuDevice]:
        def run(query: str) -> list[list[str]]:
            r = subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader,nounits"],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if r.returncode != 0:
                raise RuntimeError(r.stdout + r.stderr)
            return [[c.strip() for c in ln.split(",")] for ln in r.stdout.splitlines() if ln]

        def num(x: str) -> float | None:
            try:
                return float(x)
            except ValueError:
                return None  # "[N/A]", "[Not Supported]"

        def whole(x: str) -> int | None:
            value = num(x)
            return None if value is None else int(value)

        devs = []
        by_uuid = {}
        for row in run(self.SMI_GPU):
            dev = GpuDevice(
                index=int(row[0]),
                uuid=row[1],
                name=row[2],
                mem_used=int(float(row[3]) * MIB),
                mem_total=int(float(row[4]) * MIB),
                util=whole(row[5]),
                power_w=num(row[6]),
                temp_c=whole(row[7]),
            )
            devs.append(dev)
            by_uuid[dev.uuid] = dev
        for row in run(self.SMI_APPS):
            owner = by_uuid.get(row[2])
            if owner is not None and row[0].isdigit():
                owner.processes.append(self.owners.process(int(row[0]), int(float(row[1]) * MIB)))
        return devs
