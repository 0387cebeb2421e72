"""Queue gauges: each q_pre (one per target) and q_hs (one per drafter) against capacity."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui.fmt import bar
from dflash_tui.state import Store


class QueuePane(Static):
    DEFAULT_CSS = """
    QueuePane { height: auto; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        queues = (s.heartbeat or {}).get("queues") or {}
        t = Table.grid(padding=(0, 1))
        t.add_column(width=9)
        t.add_column(width=20)
        t.add_column()
        for name in ("q_pre", "q_hs"):
            for i, q in enumerate(queues.get(name) or []):
                depth, cap = int(q.get("depth") or 0), max(1, int(q.get("capacity") or 1))
                frac = depth / cap
                colour = "red" if frac == 0 else "yellow" if frac >= 1 else "green"
                t.add_row(f"{name}[{i}]", Text(bar(frac, 20), style=colour), f"{depth}/{cap}")
        if not t.rows:
            self.update(Text("no queues yet", style="dim"))
        else:
            self.update(t)
