"""Per-device memory as the heartbeat and metrics report it."""

from __future__ import annotations

import os

import torch

from trainer.contract.heartbeat import DeviceMemory


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def device_memory(devices: list[torch.device]) -> dict[str, DeviceMemory]:
    """Bytes per device, as the heartbeat and metrics report them; CPU reports process RSS."""
    out: dict[str, DeviceMemory] = {}
    for dev in devices:
        if dev.type == "cuda":
            s = torch.cuda.memory_stats(dev)
            out[str(dev)] = DeviceMemory(
                allocated=int(s.get("allocated_bytes.all.current", 0)),
                reserved=int(s.get("reserved_bytes.all.current", 0)),
                peak=int(s.get("allocated_bytes.all.peak", 0)),
                alloc_retries=int(s.get("num_alloc_retries", 0)),
            )
        else:
            rss = _rss_bytes()
            out[str(dev)] = DeviceMemory(allocated=rss, reserved=rss, peak=rss)
    return out
