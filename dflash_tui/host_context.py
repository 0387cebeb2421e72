"""The agent's host sample as the views say it, in one line (headless `status`, the TUI's GPU
pane): `host: 2 CPUs, load 4.50 (2.25 per CPU), CPU 97% busy, memory 3.0 GB of 8.0 GB
available, disk 40.0 GB free of 100.0 GB on /runs`. The path is the host's: a view writes it
through sanitize."""

from __future__ import annotations

from dflash_tui.fmt import size
from trainer.contract.protocol import HostSample


def summary(h: HostSample | None) -> str | None:
    if h is None:
        return None
    parts = [f"{h.cpus} CPUs"]
    if h.load:
        parts.append(f"load {h.load[0]:.2f} ({h.load[0] / h.cpus:.2f} per CPU)")
    if h.cpu_pct is not None:
        parts.append(f"CPU {h.cpu_pct:.0f}% busy")
    if h.mem_total is not None and h.mem_available is not None:
        parts.append(f"memory {size(h.mem_available)} of {size(h.mem_total)} available")
    if h.disk is not None:
        parts.append(f"disk {size(h.disk.free)} free of {size(h.disk.total)} on {h.disk.path}")
    return "host: " + ", ".join(parts)
