"""The GPUs pane: one row per device with role, memory against total and against what the
role held in earlier comparable runs (dflash_tui/facts.py: the number `memory_short` uses),
utilisation, power, temperature, where NVML gives them the SM clock and its most serious
throttle reason or ECC errors (`1.70G pwr`), and their history."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui import host_context
from dflash_tui.diagnosis import DEFAULT_CONFIG
from dflash_tui.facts import expected_memory
from dflash_tui.fmt import bar, spark
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe
from trainer.contract.protocol import (
    CLOCK_APP_SETTING,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_POWER_BRAKE,
    CLOCK_POWER_CAP,
    CLOCK_SW_THERMAL,
    CLOCK_SYNC_BOOST,
    GpuDevice,
)

ROLE_COLOUR = {"target": "cyan", "drafter": "magenta", "prefetch": "yellow"}


def expected_bytes(s: Store, role: str) -> float:
    """What a GPU of `role` ("prefetch+target") should hold: the largest expectation of its
    roles; 0 when no earlier comparable run says."""
    expect = expected_memory(s)
    return max((expect[r].usual for r in role.split("+") if r in expect), default=0.0)


# The clock cell's tag: the most serious reason first; faults bold, the usual cap dim.
CLOCK_TAGS = (
    (CLOCK_HW_THERMAL | CLOCK_SW_THERMAL, "thm", "bold red"),
    (CLOCK_HW_SLOWDOWN, "hw", "bold red"),
    (CLOCK_POWER_BRAKE, "brk", "bold red"),
    (CLOCK_POWER_CAP, "pwr", "yellow"),
    (CLOCK_SYNC_BOOST, "syn", "dim"),
    (CLOCK_APP_SETTING, "app", "dim"),
)


def clock_cell(d: GpuDevice) -> Text:
    """`1.70G pwr`: the SM clock and one tag, uncorrected ECC errors before any reason."""
    cell = Text(f"{d.sm_clock_mhz / 1000:.2f}G" if d.sm_clock_mhz is not None else "?G")
    if d.ecc_uncorrected:
        cell.append(f" ECC{d.ecc_uncorrected}", style="bold red")
        return cell
    for bits, tag, style in CLOCK_TAGS:
        if (d.clock_reasons or 0) & bits:
            cell.append(f" {tag}", style=style)
            break
    return cell


class GpuPane(Static):
    DEFAULT_CSS = """
    GpuPane { height: auto; min-height: 4; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        gpus = self._gpus(s)
        host = host_context.summary(s.host)  # under the GPUs: CPUs, load, memory, disk
        quiet.update(self, gpus if host is None else Group(gpus, safe.text(host, "dim")))

    def _gpus(self, s: Store) -> Text | Table:
        gpu = s.gpu
        if gpu is None:
            return Text("waiting for GPU samples…", style="dim")
        if gpu.state == "no_gpu":
            return Text.assemble(
                ("no NVIDIA GPU", "bold"), " on this host — ", safe.text(gpu.reason, "dim")
            )
        if gpu.state == "error":
            return safe.text(f"GPU sampling failed: {gpu.reason}", "bold red")
        roles = s.gpu_roles()
        table = Table.grid(padding=(0, 1), expand=True)
        columns: tuple[tuple[str, dict[str, Any]], ...] = (
            ("#", {"width": 2}),
            ("role", {"width": 15}),
            ("memory", {"width": 31}),
            ("util", {"width": 4, "justify": "right"}),
            ("power", {"width": 5, "justify": "right"}),
            ("temp", {"width": 4, "justify": "right"}),
            ("util history", {"ratio": 1}),
            ("memory history", {"ratio": 1}),
        )
        # Only where NVML gave clocks: nvidia-smi and older agents' rows keep their width.
        clocks = any(d.sm_clock_mhz is not None or d.clock_reasons is not None for d in gpu.devices)
        if clocks:
            columns = (*columns[:6], ("clock", {"width": 10}), *columns[6:])
        for col, kw in columns:
            table.add_column(col, no_wrap=True, overflow="crop", **kw)
        for d in gpu.devices:
            i = d.index
            role = roles.get(i, "")
            colour = ROLE_COLOUR.get(role.split("+")[0], "white")
            used, total = d.mem_used, d.mem_total or 1
            want = expected_bytes(s, role)
            mem = Text()  # the bar in the role's colour, the figures in the text's
            mem.append(bar(used / total, 10), style=colour)
            mem.append(f" {used / (1 << 30):5.1f}/{total / (1 << 30):.0f}G")
            if want:
                # Against what this role held in earlier runs: 58% means "not loaded yet"
                # or "a smaller batch", a red flag on a drafter (memory_short's bar).
                ratio = used / want
                short = ratio < DEFAULT_CONFIG.role_memory_frac
                mem.append(f" {ratio:4.0%} exp", style="bold red" if short else "dim")
            hist = list(s.gpu_history.get(i, []))
            util = d.util
            cells: list[Any] = [
                str(i),
                safe.text(role or "—", colour),  # the heartbeat's thread roles
                mem,
                Text(
                    f"{util}%" if util is not None else "?",
                    style="bold green" if (util or 0) >= 50 else "dim",
                ),
                f"{d.power_w:.0f}W" if d.power_w is not None else "?",
                f"{d.temp_c}C" if d.temp_c is not None else "?",
                Text(spark([float(h.util or 0) for h in hist], 40, 100.0), style="green"),
                Text(spark([float(h.mem_used) for h in hist], 40, float(total)), style=colour),
            ]
            if clocks:
                cells.insert(6, clock_cell(d))
            table.add_row(*cells)
        return table
