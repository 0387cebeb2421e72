"""What the GPU health readings cost per sample, through the agent's own sampler
(dflash_tui/agent/gpus.py) on whatever NVML this machine has: the real one on a GPU host,
the stand-in (tests/infra/fake_nvml on PYTHONPATH, FAKE_NVML_STATE set) elsewhere.

Usage: python bench/gpu_health_cost.py [OUT.json]   (prints one JSON object)
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from dflash_tui.agent.gpus import Gpus

HEALTH_CALLS = (
    ("nvmlDeviceGetClockInfo", ("sm",)),
    ("nvmlDeviceGetMaxClockInfo", ("sm",)),
    ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("nvmlDeviceGetTotalEccErrors", ("unc", "vol")),
    ("nvmlDeviceGetEnforcedPowerLimit", ()),
)


def per_sample(g: Gpus, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        g.sample()
    return (time.perf_counter() - t0) / n


def main() -> None:
    g = Gpus()
    out: dict[str, Any] = {"backend": g.backend, "reason": g.reason}
    if g.backend != "nvml":
        print(json.dumps(out))
        return
    n = g.nvml
    args = {
        "sm": n.NVML_CLOCK_SM,
        "unc": n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        "vol": n.NVML_VOLATILE_ECC,
    }
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, float | str] = {}
    for name, names in HEALTH_CALLS:
        fn = getattr(n, name)
        try:
            fn(h, *(args[a] for a in names))
        except Exception as e:  # what this board/driver says
            calls[name] = f"error: {e}"
            continue
        t0 = time.perf_counter()
        for _ in range(2000):
            fn(h, *(args[a] for a in names))
        calls[name] = round((time.perf_counter() - t0) / 2000 * 1e3, 4)  # ms a call
    out["ms_per_call"] = calls
    devices = g.sample()
    out["devices"] = len(devices)
    out["device0"] = {k: v for k, v in vars(devices[0]).items() if k != "processes"}
    per_sample(g, 20)  # warm
    reps = 200
    health = g._health
    out["sample_ms_with_health"] = round(per_sample(g, reps) * 1e3, 3)
    g._health = lambda h, dev: None  # type: ignore[method-assign]
    out["sample_ms_without_health"] = round(per_sample(g, reps) * 1e3, 3)
    g._health = health  # type: ignore[method-assign]
    out["added_ms_per_sample"] = round(
        out["sample_ms_with_health"] - out["sample_ms_without_health"], 3
    )
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
