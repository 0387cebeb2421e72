"""The run summary pane: once the followed run has ended it stands in for the live views
(queues, stage bars, ranks): run_summary.py's rows, host strings through widgets/safe.py."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from dflash_tui import run_summary
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe


class SummaryPane(Static):
    def update_from(self, s: Store, where: str) -> None:
        rows = run_summary.rows(s, where)
        if rows is None:
            return  # hidden while the run lives (the app hides its box)
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column(overflow="fold")
        for label, value in rows:
            style = "dim" if not label else ""
            t.add_row(Text(label), safe.text(value, style))
        quiet.update(self, t)
