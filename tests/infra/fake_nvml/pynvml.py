"""A fake `pynvml` (nvidia-ml-py) for machines with no GPU: NVML's interface, JSON-backed.

Put this directory first on PYTHONPATH and set FAKE_NVML_STATE to a JSON file:

    {"driver": "550.127.05",                                   # optional
     "devices": [{"name": "NVIDIA H200", "uuid": "GPU-...", "mem_total": bytes,
                  "mem_base": bytes, "util": int, "mem_util": int (optional),
                  "power_w": float, "temp_c": int,
                  # health readings, all optional (an H200 at rest when absent):
                  "sm_clock_mhz": int, "sm_clock_max_mhz": int, "mem_clock_mhz": int,
                  "clocks_event_reasons": int (NVML's bitmask), "power_limit_w": float,
                  "ecc_uncorrected": int, "ecc_corrected": int (volatile counts),
                  "ecc_uncorrected_aggregate": int, "ecc_corrected_aggregate": int,
                  "unsupported": ["nvmlDeviceGetTotalEccErrors", ...],
                  "missing": ["nvmlDeviceGetCurrentClocksEventReasons", ...],
                  "lost": bool (every call on the device raises GPU_IS_LOST: a wedged board)}],
     "processes": [{"pid": int, "device": int, "mem": bytes}]}

The file is re-read on every call, so a test can change it under a running program.
A listed process counts only while its pid is alive (not a zombie), so killing a real
trainer "frees" its memory just as the driver would. Device memory used = mem_base + the
live processes' mem. Names, return types and errors follow nvidia-ml-py 12.x: strings come
back as str, handles are opaque, failures raise NVMLError subclasses carrying NVML codes.
A function named in a device's "unsupported" raises NVMLError_NotSupported for that device,
as NVML returns NVML_ERROR_NOT_SUPPORTED for a reading the board does not have (ECC off, a
consumer card's throttle reasons); one named in "missing" raises NVMLError_FunctionNotFound,
as pynvml does on a driver whose library lacks the symbol. No state file (or FAKE_NVML_STATE
unset) reads as "Driver Not Loaded" at nvmlInit; the file vanishing after nvmlInit reads as
"GPU is lost".
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_COUNT = 1

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1

# Clock event ("throttle") reasons: one bitmask, nvml.h's values.
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonApplicationsClocksSetting = nvmlClocksEventReasonApplicationsClocksSetting
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSyncBoost = nvmlClocksEventReasonSyncBoost
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown
nvmlClocksThrottleReasonDisplayClockSetting = nvmlClocksEventReasonDisplayClockSetting
nvmlClocksThrottleReasonNone = nvmlClocksEventReasonNone
_SUPPORTED_EVENT_REASONS = 0x1FF

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

# What NVML reports for gpuInstanceId/computeInstanceId outside MIG mode.
_NO_INSTANCE = 0xFFFFFFFF

_DEFAULT_DRIVER = "550.127.05"


class NVMLError(Exception):
    """NVMLError(code) -> the NVMLError_<Name> subclass for that code, like the real one."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string: dict[int, str] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        # NVMLError(9) hands back an NVMLError_DriverNotLoaded, so either can be caught.
        actual = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(actual)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        if isinstance(self.value, str):  # tolerate NVMLError("text") from hand-written fakes
            return self.value
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    def init(self: NVMLError, *args: object) -> None:
        Exception.__init__(self, code)

    cls = type(name, (NVMLError,), {"__new__": new, "__init__": init, "__module__": __name__})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)


# Class names below are pynvml's own.
class nvmlFriendlyObject:
    """What pynvml returns for process lists: plain attributes."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return str(self.__dict__)

    __repr__ = __str__


class c_nvmlMemory_t:
    def __init__(self, total: int, free: int, used: int) -> None:
        self.total = total
        self.free = free
        self.used = used

    def __repr__(self) -> str:
        return f"c_nvmlMemory_t(total: {self.total} B, free: {self.free} B, used: {self.used} B)"


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory

    def __repr__(self) -> str:
        return f"c_nvmlUtilization_t(gpu: {self.gpu} %, memory: {self.memory} %)"


class c_nvmlDevice_t:
    """Opaque device handle; only the index means anything, and only to this module."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, c_nvmlDevice_t) and other._index == self._index

    def __hash__(self) -> int:
        return hash(self._index)

    def __repr__(self) -> str:
        return f"<c_nvmlDevice_t #{self._index}>"


_lock = threading.Lock()
_refcount = 0  # nvmlInit/nvmlShutdown nest, as in NVML


def _read_state() -> dict[str, Any] | None:
    path = os.environ.get("FAKE_NVML_STATE")
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _state() -> dict[str, Any]:
    """The current state for a call made after nvmlInit."""
    if _refcount == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    state = _read_state()
    if state is None:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return state


def _device(handle: c_nvmlDevice_t) -> dict[str, Any]:
    devices = _state()["devices"]
    if not isinstance(handle, c_nvmlDevice_t) or not 0 <= handle._index < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if devices[handle._index].get("lost"):  # fallen off the bus: NVML answers nothing of it
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return devices[handle._index]


def _reading(handle: c_nvmlDevice_t, function: str) -> dict[str, Any]:
    """The device's state for a health reading; NOT_SUPPORTED where the state says so."""
    dev = _device(handle)
    if function in dev.get("unsupported", ()):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if function in dev.get("missing", ()):  # an older driver's libnvml has no such symbol
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return dev


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie: the driver frees memory at exit, not when the parent reaps."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _live_processes(index: int) -> list[dict[str, Any]]:
    return [
        p
        for p in _state().get("processes", [])
        if int(p.get("device", 0)) == index and pid_alive(int(p["pid"]))
    ]


# --- library ---------------------------------------------------------------------------


def nvmlInit() -> None:
    global _refcount
    if _read_state() is None:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    with _lock:
        _refcount += 1


nvmlInit_v2 = nvmlInit


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _refcount
    with _lock:
        if _refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1


def nvmlErrorString(result: int) -> str:
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


def nvmlSystemGetDriverVersion() -> str:
    return str(_state().get("driver", _DEFAULT_DRIVER))


def nvmlSystemGetNVMLVersion() -> str:
    return "12." + nvmlSystemGetDriverVersion()


# --- devices ---------------------------------------------------------------------------


def nvmlDeviceGetCount() -> int:
    return len(_state()["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    handle = c_nvmlDevice_t(int(index))
    _device(handle)
    return handle


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t:
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, dev in enumerate(_state()["devices"]):
        if dev["uuid"] == wanted:
            return c_nvmlDevice_t(i)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    _device(handle)
    return handle._index


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle)["name"])


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle)["uuid"])


class c_nvmlPciInfo_t:
    def __init__(self, index: int) -> None:
        # The stand-in nvidia-smi's gpu_bus_id: bus 0x18 + index, as on an 8-GPU board.
        self.busId = f"00000000:{index + 0x18:02X}:00.0"
        self.busIdLegacy = self.busId[4:]
        self.domain, self.bus, self.device = 0, index + 0x18, 0


def nvmlDeviceGetPciInfo(handle: c_nvmlDevice_t) -> c_nvmlPciInfo_t:
    _device(handle)
    return c_nvmlPciInfo_t(handle._index)


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: object = None) -> c_nvmlMemory_t:
    dev = _device(handle)
    total = int(dev["mem_total"])
    held = sum(int(p["mem"]) for p in _live_processes(handle._index))
    used = min(total, int(dev.get("mem_base", 0)) + held)
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
    dev = _device(handle)
    return c_nvmlUtilization_t(gpu=int(dev.get("util", 0)), memory=int(dev.get("mem_util", 0)))


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:
    """Milliwatts, as NVML reports them."""
    return round(float(_device(handle).get("power_w", 0.0)) * 1000)


def nvmlDeviceGetTemperature(handle: c_nvmlDevice_t, sensor: int) -> int:
    dev = _device(handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(dev.get("temp_c", 0))


def nvmlDeviceGetComputeRunningProcesses_v3(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]:
    _device(handle)
    return [
        nvmlFriendlyObject(
            {
                "pid": int(p["pid"]),
                "usedGpuMemory": int(p["mem"]),
                "gpuInstanceId": _NO_INSTANCE,
                "computeInstanceId": _NO_INSTANCE,
            }
        )
        for p in _live_processes(handle._index)
    ]


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses_v3
nvmlDeviceGetComputeRunningProcesses = nvmlDeviceGetComputeRunningProcesses_v3


def nvmlDeviceGetGraphicsRunningProcesses(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]:
    _device(handle)
    return []  # a headless training box runs no graphics contexts


# --- health: clocks, throttle reasons, ECC, power limit ---------------------------------
# Absent from the state, a reading is an H200's at rest: max clocks, no reasons, no errors.
_H200_SM_MAX_MHZ = 1980
_H200_MEM_MHZ = 3201
_H200_VIDEO_MHZ = 1965
_H200_POWER_LIMIT_W = 700.0


def _clock(dev: dict[str, Any], clock_type: int, current: bool) -> int:
    sm_max = int(dev.get("sm_clock_max_mhz", _H200_SM_MAX_MHZ))
    if clock_type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):  # one clock domain on Hopper
        return int(dev.get("sm_clock_mhz", sm_max)) if current else sm_max
    if clock_type == NVML_CLOCK_MEM:
        return int(dev.get("mem_clock_mhz", _H200_MEM_MHZ))
    if clock_type == NVML_CLOCK_VIDEO:
        return _H200_VIDEO_MHZ
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetClockInfo(handle: c_nvmlDevice_t, type: int) -> int:
    """The current clock of a domain, MHz."""
    return _clock(_reading(handle, "nvmlDeviceGetClockInfo"), type, current=True)


def nvmlDeviceGetMaxClockInfo(handle: c_nvmlDevice_t, type: int) -> int:
    """The board's maximum clock of a domain, MHz."""
    return _clock(_reading(handle, "nvmlDeviceGetMaxClockInfo"), type, current=False)


def nvmlDeviceGetSupportedClocksEventReasons(handle: c_nvmlDevice_t) -> int:
    _reading(handle, "nvmlDeviceGetSupportedClocksEventReasons")
    return _SUPPORTED_EVENT_REASONS


def nvmlDeviceGetCurrentClocksEventReasons(handle: c_nvmlDevice_t) -> int:
    """Why the clocks are below max now: a bitmask of nvmlClocksEventReason*."""
    dev = _reading(handle, "nvmlDeviceGetCurrentClocksEventReasons")
    return int(dev.get("clocks_event_reasons", nvmlClocksEventReasonNone))


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: c_nvmlDevice_t) -> int:
    """The deprecated name (drivers before 535) of the same reading."""
    dev = _reading(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return int(dev.get("clocks_event_reasons", nvmlClocksEventReasonNone))


nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons


def nvmlDeviceGetEccMode(handle: c_nvmlDevice_t) -> list[int]:
    """[current, pending]; NOT_SUPPORTED on a board without ECC."""
    _reading(handle, "nvmlDeviceGetEccMode")
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]


def nvmlDeviceGetTotalEccErrors(handle: c_nvmlDevice_t, errorType: int, counterType: int) -> int:
    """ECC errors of a type: volatile (since the driver loaded) or aggregate (board life)."""
    dev = _reading(handle, "nvmlDeviceGetTotalEccErrors")
    kinds = {
        NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected",
    }
    if errorType not in kinds or counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    volatile = int(dev.get(f"ecc_{kinds[errorType]}", 0))
    if counterType == NVML_VOLATILE_ECC:
        return volatile
    return int(dev.get(f"ecc_{kinds[errorType]}_aggregate", volatile))


def nvmlDeviceGetEnforcedPowerLimit(handle: c_nvmlDevice_t) -> int:
    """Milliwatts: the limit the board enforces now."""
    dev = _reading(handle, "nvmlDeviceGetEnforcedPowerLimit")
    return round(float(dev.get("power_limit_w", _H200_POWER_LIMIT_W)) * 1000)


def nvmlDeviceGetPowerManagementLimit(handle: c_nvmlDevice_t) -> int:
    dev = _reading(handle, "nvmlDeviceGetPowerManagementLimit")
    return round(float(dev.get("power_limit_w", _H200_POWER_LIMIT_W)) * 1000)
