"""The fleet screen: one row per configured target (dflash_tui/fleet.py's FleetRow), redrawn
from the targets' stores twice a second. Enter (or a click) on a row hands its name to
`on_open`; the app shows that target's dashboard (dflash_tui/app_fleet.py).

Every cell that quotes a host (run id, phase, the link's cause, the finding) is a `Text`
from widgets/safe.py: a `str` in a DataTable cell would be read as markup."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from dflash_tui.fleet import FleetRow
from dflash_tui.fmt import duration, rate
from dflash_tui.widgets import safe
from dflash_tui.widgets.footer import Footer

# (key, label, width): None fits the content; the host's long strings get a fixed width
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("target", "TARGET", None),
    ("status", "STATUS", None),
    ("connection", "CONNECTION", 36),
    ("run", "RUN", None),
    ("phase", "PHASE", None),
    ("step", "STEP", None),
    ("tok_s", "TOK/S", None),
    ("worst", "WORST FINDING", 44),
    ("hb", "HEARTBEAT", None),
)
STATUS_STYLE = {0: "bold green", 1: "bold yellow", 2: "bold red", 3: "bold red"}
SEVERITY_STYLE = {"critical": "red", "warning": "yellow", "info": "dim"}


def cells(row: FleetRow) -> dict[str, Text]:
    """The row's cells by column key; `—` where there is nothing to say."""
    connection_style = "green" if row.connection == "connected" else "yellow"
    if row.connection.startswith(("refused", "unreachable")):
        connection_style = "red"
    worst_style = SEVERITY_STYLE.get(row.worst.severity, "") if row.worst else "dim"
    return {
        "target": safe.text(row.name, "bold"),
        "status": Text(row.status_word, style=STATUS_STYLE.get(row.status, "")),
        "connection": safe.text(row.connection, connection_style),
        "run": safe.text(row.run_id or "—"),
        "phase": safe.text(row.phase or "—"),
        "step": Text("—" if row.step is None else str(row.step), justify="right"),
        "tok_s": Text("—" if row.tok_s is None else rate(row.tok_s), justify="right"),
        "worst": safe.text(row.worst_text(), worst_style),
        "hb": Text(
            "—" if row.heartbeat_age_s is None else f"{duration(row.heartbeat_age_s)} ago",
            justify="right",
        ),
    }


class FleetScreen(Screen[None]):
    BINDINGS = [Binding("q", "app.quit", "quit"), Binding("enter", "open", "open", show=True)]
    REFRESH_S = 0.5
    DEFAULT_CSS = """
    FleetScreen #fleet-title { height: 1; background: $panel; padding: 0 1; }
    FleetScreen #fleet-table { height: 1fr; }
    FleetScreen #fleet-hint { height: 1; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, rows: Callable[[], list[FleetRow]], on_open: Callable[[str], None]) -> None:
        super().__init__()
        self._rows = rows
        self._on_open = on_open

    def compose(self) -> ComposeResult:
        yield Static(Text(" dflash-tui fleet ", style="bold reverse"), id="fleet-title")
        yield DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        yield Static(
            Text("enter: the target's dashboard (esc or q there: back here)   q: quit"),
            id="fleet-hint",
        )
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        self.redraw()
        self.set_interval(self.REFRESH_S, self.redraw)

    def redraw(self) -> None:
        table = self.query_one(DataTable)
        for row in self._rows():
            by_key = cells(row)
            if row.name in table.rows:
                for key, value in by_key.items():
                    table.update_cell(row.name, key, value, update_width=True)
            else:
                table.add_row(*(by_key[k] for k, _, _ in COLUMNS), key=row.name)

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
            if key.value is not None:
                self._on_open(key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self._on_open(event.row_key.value)
