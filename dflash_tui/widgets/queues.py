"""Queue gauges: the queues the run has, against capacity: under fixed routing each q_pre
(one per target) and q_hs (one per drafter); under shared one of each, which every target
or drafter takes from. The bars in the theme's colours: error when empty (the consumer
starves), warning when full (the producer waits), success between."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui.fmt import bar, count
from dflash_tui.state import Store
from dflash_tui.widgets import palette, quiet


class QueuePane(Static):
    DEFAULT_CSS = """
    QueuePane { height: auto; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        queues = s.heartbeat.queues if s.heartbeat else None
        t = Table.grid(padding=(0, 1))
        t.add_column(width=9)
        t.add_column(width=20)
        t.add_column()
        shared = queues is not None and queues.shared
        for name, depths in (("q_pre", queues.q_pre), ("q_hs", queues.q_hs)) if queues else ():
            for i, q in enumerate(depths):
                depth, cap = q.depth, max(1, q.capacity)
                # min() first: a 400-digit depth from a hostile file overflows a float division
                frac = min(depth, cap) / cap
                role = "error" if frac == 0 else "warning" if frac >= 1 else "success"
                colour = palette.hex_of(self.app, role)
                shown = f"{count(depth)}/{count(cap)}"
                if shared:  # one queue of each, fed to every target / drafter
                    feeds = "all targets" if name == "q_pre" else "all drafters"
                    t.add_row(name, Text(bar(frac, 20), style=colour), f"{shown}  {feeds}")
                else:
                    t.add_row(f"{name}[{i}]", Text(bar(frac, 20), style=colour), shown)
        if not t.rows:
            quiet.update(self, Text("no queues yet", style="dim"))
        else:
            quiet.update(self, t)
