"""The GPUs pane: one row per device with role, memory against total and against what the
role needed in earlier runs, utilisation, power, temperature, and their history."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui.fmt import bar, spark
from dflash_tui.state import Store

ROLE_COLOUR = {"target": "cyan", "drafter": "magenta", "prefetch": "yellow"}


def expected_memory(s: Store) -> dict[str, int]:
    """{role: bytes}: the largest memory that role held in an earlier run of this config."""
    name = (s.current_run() or {}).get("name")
    out: dict[str, int] = {}
    for r in s.runs:
        if r.get("run_id") == s.run_id or (name and r.get("name") != name):
            continue
        for role, peak in (r.get("role_memory") or {}).items():
            out[role] = max(out.get(role, 0), int(peak or 0))
    return out


class GpuPane(Static):
    DEFAULT_CSS = """
    GpuPane { height: auto; min-height: 4; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        gpu = s.gpu
        if gpu is None:
            self.update(Text("waiting for GPU samples…", style="dim"))
            return
        if gpu.get("state") == "no_gpu":
            self.update(
                Text.assemble(
                    ("no NVIDIA GPU", "bold"),
                    " on this host — ",
                    (str(gpu.get("reason", "")), "dim"),
                )
            )
            return
        if gpu.get("state") == "error":
            self.update(Text(f"GPU sampling failed: {gpu.get('reason')}", style="bold red"))
            return
        roles = s.gpu_roles()
        expect = expected_memory(s)
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
        for col, kw in columns:
            table.add_column(col, no_wrap=True, overflow="crop", **kw)
        for d in gpu.get("devices") or []:
            i = int(d["index"])
            role = roles.get(i, "")
            colour = ROLE_COLOUR.get(role.split("+")[0], "white")
            used, total = int(d.get("mem_used") or 0), int(d.get("mem_total") or 1)
            want = max((expect.get(r, 0) for r in role.split("+") if r), default=0)
            mem = Text(bar(used / total, 10), style=colour)
            mem.append(f" {used / (1 << 30):5.1f}/{total / (1 << 30):.0f}G")
            if want:
                # Against what this role held in an earlier run: 58% means "not loaded yet"
                # or "a smaller batch", a red flag on a drafter.
                ratio = used / want
                mem.append(f" {ratio:4.0%} exp", style="bold red" if ratio < 0.9 else "dim")
            hist = list(s.gpu_history.get(i, []))
            util = d.get("util")
            table.add_row(
                str(i),
                Text(role or "—", style=colour),
                mem,
                Text(
                    f"{util}%" if util is not None else "?",
                    style="bold green" if (util or 0) >= 50 else "dim",
                ),
                f"{d['power_w']:.0f}W" if d.get("power_w") is not None else "?",
                f"{d['temp_c']}C" if d.get("temp_c") is not None else "?",
                Text(spark([float(h[2] or 0) for h in hist], 40, 100.0), style="green"),
                Text(spark([float(h[1]) for h in hist], 40, float(total)), style=colour),
            )
        self.update(table)
