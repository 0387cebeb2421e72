"""The ranks pane: one row per rank of a processes-mode job (the store's `ranks`).

    rank  role       host    device  phase     step  lag  tok/s  compute  comm  state
    3     drafter 1  gpu-7   cuda:3  training   412   0s   1.5K   611 ms  19 ms straggler

Compute vs comm is the rank's loop split (dflash_tui/rank_balance.py); the state mark is the
rules' (diagnosis.rank_marks), else `relayed` for a rank of another host (known through the
writer's heartbeat.json, ranks_view.fold_relayed). Host strings (host, device, phase, role,
an unreadable file's reason) go through widgets/safe.py. Hidden for a threads-mode run: its
box carries the `-no-ranks` class until a rank heartbeat arrives (app.tcss).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui import rank_balance, ranks_view
from dflash_tui.fmt import rate
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe

HOST_MAX = 16  # a longer host name is cut (the host chooses it)
REASON_MAX = 48  # why a rank's file is unreadable (it quotes the file): cut to this
COLUMNS = ("rank", "role", "host", "device", "phase", "step", "lag", "tok/s", "compute", "comm")
MARK_STYLE = {
    "failed": "bold red",
    "silent": "bold red",
    "straggler": "bold yellow",
    "relayed": "dim",  # a rank of another host, through the writer's heartbeat.json
}


def _cut(value: str, width: int, style: str = "") -> Text:
    t = safe.text(value, style)
    t.truncate(width, overflow="ellipsis")
    return t


class RanksPane(Static):
    DEFAULT_CSS = """
    RanksPane { height: auto; padding: 0 1; }
    """

    def update_from(self, s: Store, marks: dict[int, str]) -> None:
        box = self.parent
        if box is not None:
            box.set_class(not s.ranks, "-no-ranks")
        if not s.ranks:
            quiet.update(self, Text(""))
            return
        t = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        for name in COLUMNS:
            right = name in ("rank", "step", "lag", "tok/s", "compute", "comm")
            t.add_column(name, justify="right" if right else "left", no_wrap=True)
        t.add_column("state", no_wrap=True)
        behind = ranks_view.lags(s.ranks)
        for rank, seen in sorted(s.ranks.items()):
            b = seen.beat
            if b is None:  # its reason in the last column, cut: no cell may widen the rest
                empty = [Text("")] * (len(COLUMNS) - 2)
                why = _cut(seen.error or "", REASON_MAX, "red")
                t.add_row(Text(str(rank)), Text("unreadable", style="red"), *empty, why)
                continue
            sp = rank_balance.split(b)
            mark = marks.get(rank, "") or ("relayed" if seen.relayed else "")
            t.add_row(
                Text(str(rank)),
                _cut(f"{b.role} {b.index}", 12),
                _cut(b.host, HOST_MAX),
                _cut(b.device, 10),
                _cut(b.phase, 14),
                Text(str(b.step)),
                Text(f"{behind.get(rank, 0.0):.0f}s"),
                Text(rate(b.tok_s).removesuffix(" tok/s") if sp else "-"),
                Text(f"{sp.compute_ms:.0f} ms" if sp else "-"),
                Text(f"{sp.comm_ms:.0f} ms" if sp else "-"),
                Text(mark, style=MARK_STYLE.get(mark, "")),
            )
        quiet.update(self, t)
