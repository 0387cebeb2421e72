"""The GPUs pane: one row per device with role, memory against total and against what the
role held in earlier comparable runs (dflash_tui/facts.py: the number `memory_short` uses),
utilisation, power, temperature, where NVML gives them the SM clock and its most serious
throttle reason or ECC errors (`1.70G pwr`), and their history.

Compact (a terminal too short for a row per device, widgets/layout.py): one line for all of
them, a block per device for its utilisation and one for its memory, the ranges, and the
first device a throttle or ECC tag names."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from dflash_tui import host_context
from dflash_tui.diagnosis import DEFAULT_CONFIG
from dflash_tui.diagnosis.memory import gpu_swings
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

HISTORY_MIN = 4  # a history's fewest cells worth keeping (each column: +2 of padding)
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


def span(values: list[float], unit: str) -> str:
    """`89–95%` for a range, `92%` for one value (rounded to whole units)."""
    lo, hi = round(min(values)), round(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def compact_line(s: Store) -> Text:
    """Every device on one line: `8× H200  util ▇▇▇▇▇▇▇▇ 89–95%  mem ▅▅▅▅▅▅▅▅ 77–78/140G …`."""
    gpu = s.gpu
    assert gpu is not None and gpu.devices
    roles = s.gpu_roles()
    devices = sorted(gpu.devices, key=lambda d: d.index)
    names = {d.name.removeprefix("NVIDIA ") for d in devices}
    line = Text(f"{len(devices)}× {names.pop() if len(names) == 1 else 'GPUs'}", style="bold")
    line.append("  util ")
    for d in devices:
        colour = ROLE_COLOUR.get(roles.get(d.index, "").split("+")[0], "white")
        line.append(spark([float(d.util or 0)], 1, 100.0), style=colour)
    line.append(" " + span([float(d.util or 0) for d in devices], "%"))
    line.append("  mem ")
    for d in devices:
        colour = ROLE_COLOUR.get(roles.get(d.index, "").split("+")[0], "white")
        line.append(spark([float(d.mem_used)], 1, float(d.mem_total or 1)), style=colour)
    used = span([d.mem_used / (1 << 30) for d in devices], "")
    line.append(f" {used}/{max(d.mem_total for d in devices) / (1 << 30):.0f}G")
    for d in devices:  # the first device throttled for a fault or with ECC errors: early,
        tag = clock_cell(d)  # as the line is cut at the pane's edge, not wrapped
        if d.ecc_uncorrected or any(sp.style == "bold red" for sp in tag.spans):
            line.append(f"  GPU {d.index}", style="bold red")
            line.append_text(tag[tag.plain.index(" ") :] if " " in tag.plain else tag)
            break
    powers = [d.power_w for d in devices if d.power_w is not None]
    temps = [float(d.temp_c) for d in devices if d.temp_c is not None]
    if powers:
        line.append("  " + span(powers, "W"))
    if temps:
        line.append(" " + span(temps, "C"))
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


class GpuPane(Static):
    DEFAULT_CSS = """
    GpuPane { height: auto; min-height: 4; padding: 0 1; }
    GpuPane.-compact { min-height: 1; }
    """

    compact = reactive(False)  # set by widgets/layout.py: one line for every device

    def watch_compact(self, compact: bool) -> None:
        self.set_class(compact, "-compact")
        store = getattr(self, "_store", None)
        if store is not None:
            self.update_from(store)

    def on_resize(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            self.update_from(store)

    def update_from(self, s: Store) -> None:
        self._store = s
        if self.compact and s.gpu is not None and s.gpu.state is None and s.gpu.devices:
            quiet.update(self, compact_line(s))
            return
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
        # Fitted to the pane: the histories first, then the clock give way, never a figure cut
        # in half (at 120 columns the pane is ~70 wide: `40` was util 40% cut to two cells).
        room = (self.size.width - 2) if self.size.width else 1000
        keep = [name for name, _ in columns]
        for name in ("memory history", "util history", "clock"):
            fixed = sum(kw.get("width", HISTORY_MIN) + 2 for n, kw in columns if n in keep)
            if fixed <= room or name not in keep:
                continue
            keep.remove(name)
        for col, kw in columns:
            if col in keep:
                table.add_column(col, no_wrap=True, overflow="crop", **kw)
        swings = gpu_swings(s, gpu.t or s.clock())  # the agent's clock, as the samples'
        for d in gpu.devices:
            i = d.index
            role = roles.get(i, "")
            colour = ROLE_COLOUR.get(role.split("+")[0], "white")
            used, total = d.mem_used, d.mem_total or 1
            want = expected_bytes(s, role)
            mem = Text()  # the bar in the role's colour, the figures in the text's
            mem.append(bar(used / total, 10), style=colour)
            mem.append(f" {used / (1 << 30):5.1f}/{total / (1 << 30):.0f}G")
            swing = swings.get(i)
            if swing is not None and swing.fall >= DEFAULT_CONFIG.swing_min_bytes:
                # memory_swing's evidence, in place of the usual-memory ratio (the cell's room)
                mem.append(f" ↕{swing.fall / (1 << 30):.1f}G", style="bold yellow")
            elif want:
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
            table.add_row(*(c for (name, _), c in zip(columns, cells, strict=True) if name in keep))
        return table
