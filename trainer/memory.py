"""Per-device memory as the heartbeat and metrics report it."""

from __future__ import annotations

import os
from typing import Any

import torch


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def device_memory(devices: list[torch.device]) -> dict[str, dict[str, Any]]:
    """{device: {allocated, reserved, peak, alloc_retries}} in bytes; CPU reports process RSS."""
    out: dict[str, dict[str, Any]] = {}
    for dev in devices:
        if dev.type == "cuda":
            s = torch.cuda.memory_stats(dev)
            out[str(dev)] = {
                "allocated": s.get("allocated_bytes.all.current", 0),
                "reserved": s.get("reserved_bytes.all.current", 0),
                "peak": s.get("allocated_bytes.all.peak", 0),
                "alloc_retries": s.get("num_alloc_retries", 0),
            }
        else:
            rss = _rss_bytes()
            out[str(dev)] = {"allocated": rss, "reserved": rss, "peak": rss, "alloc_retries": 0}
    return out
