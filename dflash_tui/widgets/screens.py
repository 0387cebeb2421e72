"""Screens: a searchable text (stack dumps, run info, the log viewer), help, the runs.
Restart's dialog: widgets/restart_dialog.py; the dialogs that kill, clear or signal:
widgets/dialogs.py."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Label, Static

from dflash_tui import runs_view
from dflash_tui.facts import run_outcome
from dflash_tui.widgets import keys, safe
from dflash_tui.widgets.filterbar import FilterBar
from dflash_tui.widgets.search import Search, SearchKeys, SearchText
from trainer.contract.outcomes import CRASH, DIED, FINISHED, KILLED, RUNNING, STOPPED_EARLY
from trainer.contract.protocol import RunInfo

OUTCOME_STYLE = {
    RUNNING: "green",
    FINISHED: "green",
    STOPPED_EARLY: "yellow",
    CRASH: "red",
    KILLED: "red",
    DIED: "red",
}


class TextScreen(SearchKeys, Screen[None]):
    """A full screen of text the host wrote (a stack dump, py-spy's output, run info, the
    step log), scrollable with j k g G, the arrows and the mouse; `/` searches, n / N go
    from match to match; escape or q goes back. A viewer: it sends nothing (keys.py)."""

    BINDINGS = keys.VIEWER
    DEFAULT_CSS = """
    TextScreen SearchText { padding: 0 1; }
    TextScreen #title { background: $panel; padding: 0 1; text-style: bold; }
    TextScreen #keys { background: $panel; padding: 0 1; height: 1; }
    """

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text, self.body = title, text
        self.search = Search(self, TEXT_KEYS)

    def compose(self) -> ComposeResult:
        yield Static(safe.text(self.title_text), id="title")
        yield SearchText(safe.log_text(self.body), id="scroll")
        yield self.search.status()
        yield self.search.bar()

    def on_mount(self) -> None:
        self.query_one(SearchText).focus()  # j and k scroll here (kill is K, and asks)


TEXT_KEYS = "j/k ↑/↓ scroll · g/G top/bottom · PgUp/PgDn · / search, n/N · esc/q back"

HELP = """\
The run
  These act on the dashboard only (and from ctrl+p), never in a viewer.
  r        restart (asks): kill, wait for GPU memory, launch the same
           config; resume from its newest good checkpoint, or step 0
  K        kill (shift+k; type kill and Enter): SIGTERM its process
           group, then SIGKILL; shows the GPU memory drain
  d        dump every thread's stack (SIGUSR1; py-spy where installed)
  c        clear the compile cache (type clear and Enter); refused
           while a run lives
  l Enter  choose a run (Enter on a row: its whole history, alive or
           not); by default the latest. In the list: space marks runs,
           c compares the marked ones, / filters (words, outcome:KIND),
           s sorts (start, tok/s, τ, steps), S turns the order round
  i        run info: how it ended, its exit, environment, whole config
  T        threads and processes: Enter on a thread shows its part of
           the newest dump (d), on a process of the run asks for a
           signal's name, typed; s sorts (CPU, name, time in state,
           loop), / filters by words
  P        GPU processes: on each GPU pid, user, memory, command, this
           run's or not; a GPU NVML cannot read; the kernel log's Xids
  p        replay the run's telemetry with these panes: ← → an entry,
           [ ] a minute, Home End, e the end, / filters its log;
           control keys are off there; q or Esc returns to live

The step log
  /        filter: a regular expression, case-insensitive, applied as
           you type; Enter keeps it, Esc puts back the one before,
           empty = all; the log's title counts the lines shown
  f        follow / pause
  w        wrap long lines, or one line each (← → scroll sideways)
  C        a wall-clock column: each step line's time (metrics.jsonl's),
           in your time zone; other lines leave it blank
  o        the log in $PAGER (plain less without one); q comes back
  v        the log in a viewer: / search, n N next / previous
  g Home   train.log from its first line, paged (PgUp at the top: the
           page before, PgDn at the bottom: the page after)
  G End    back to the newest lines

Panes
  Tab      next pane, shift+Tab the one before (its border lights up)
  z        zoom the focused pane to the whole screen; z or Esc back
  j k      scroll down / up (↓ ↑, PgDn PgUp too) in the focused pane:
           step log, alerts, stack viewer, runs list, this help
  g G      to the top / the bottom
  L        on the plots: the loss on a log scale, or back
  + -      on the plots: smooth more / less (EMA 0.6 … 0.99, or raw)
  x        on the plots: time (minutes) or step on the x-axis
  ← →      on the plots: a cursor over the rows, their values above;
           → past the newest puts it away
  x        on the alerts: what each alert's code means, how it is
           decided and what to do (dflash-tui explain); ← → between them
  mouse    the wheel scrolls the pane under the pointer; click focuses

Viewers (stacks, run info, the log viewer, threads, replay, compare,
this help): they read and never send
  /        search: a regular expression, case-insensitive
  n N      the next / the previous match
  q Esc    close

Everywhere
  ctrl+p   the command palette: every action by name
  t        next theme (dark, light, high-contrast, …); remembered
  Esc      close a dialog, the filter, a zoom or a screen
  ?        this help
  q        quit (on the dashboard): the remote run is left alone
"""


class HelpScreen(SearchKeys, ModalScreen[None]):
    BINDINGS = [*keys.VIEWER, Binding("question_mark", "close", "close", show=False)]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 92; max-width: 100%; height: auto; max-height: 100%;
                            border: thick $primary; background: $surface; }
    HelpScreen SearchText { height: auto; max-height: 100%; padding: 0 1;
                            scrollbar-size-vertical: 1; }
    HelpScreen #keys { height: 1; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.search = Search(self, "j/k scroll · / search, n/N · esc close")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield SearchText(Text("dflash-tui keys\n", style="bold") + Text(HELP))
            yield self.search.status()
        yield self.search.bar()

    def on_mount(self) -> None:
        self.query_one(SearchText).focus()


class RunsTable(DataTable[object]):
    """The runs, one a row: j k g G move the cursor as the arrows and Home/End do."""

    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
        Binding("g", "scroll_top", "top", show=False),
        Binding("G", "scroll_bottom", "bottom", show=False),
    ]


class RunsScreen(ModalScreen[str | list[str] | None]):
    """Runs under the run root, with how each ended (the outcome's words); Enter picks one
    (its id), space marks runs and c compares the marked ones (their ids, as a list); `/`
    filters (runs_view.RunFilter: words, `outcome:KIND`), `s` sorts by the next key (start,
    tok/s, τ, steps), `S` turns the order round. The columns that fit the width are shown,
    in priority order (runs_view.COLUMNS)."""

    BINDINGS = [
        Binding("escape,q", "cancel", "back"),
        Binding("a", "latest", "follow latest"),
        Binding("space", "mark", "mark"),
        Binding("c", "compare", "compare marked"),
        Binding("slash", "filter", "filter"),
        Binding("s", "sort", "sort"),
        Binding("S", "reverse", "reverse", show=False),
        Binding("l", "cancel", "back", show=False),  # not a second runs list over this one
    ]
    DEFAULT_CSS = """
    RunsScreen { align: center middle; }
    RunsScreen > Vertical { width: 140; max-width: 100%; height: 80%; border: thick $primary;
                            background: $surface; }
    RunsScreen DataTable { height: 1fr; }
    """
    WIDTH = 140  # the box's width when the terminal has it
    SHOWN = ("id", "outcome", "steps", "toks", "tau", "phase", "error")

    def __init__(self, runs: list[RunInfo], current: str | None) -> None:
        super().__init__()
        self.runs, self.current = runs, current
        self.marked: list[str] = []  # in the order marked
        self.filter_text = ""
        self.sort = "start"
        self.reverse = False
        self.shown: list[RunInfo] = []
        self._width = 0

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(id="runs-title")
            yield RunsTable(cursor_type="row", id="runs")
        yield FilterBar(self.apply_filter, placeholder="words, outcome:KIND · Enter · Esc")

    def on_mount(self) -> None:
        self.fill(keep=self.current)
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        if self._table_width() != self._width:
            self.fill(keep=self._cursor_run())

    def _table_width(self) -> int:
        # the box less its border, and the table's scrollbar
        return min(self.WIDTH, self.app.size.width) - 4

    def _cursor_run(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def fill(self, keep: str | None = None) -> None:
        """The table anew: the runs the filter lets through, sorted, the columns that fit."""
        table = self.query_one(DataTable)
        self._width = self._table_width()
        self.shown = runs_view.view(self.runs, self.filter_text, self.sort, self.reverse)
        plan = runs_view.plan_columns(self.shown or self.runs, self._width, self.SHOWN)
        table.clear(columns=True)
        for c, w in plan:
            key = table.add_column(c.header.lower(), width=w, key=c.name)
            if c.name == "id":
                self.id_column = key
        for r in self.shown:
            cells = []
            for c, w in plan:
                text = runs_view.fit(c.cell(r), w)
                if c.name == "outcome":
                    kind = run_outcome(r).kind
                    cells.append(safe.text(text, OUTCOME_STYLE.get(kind, "dim")))
                elif c.name == "id" and r.run_id in self.marked:
                    cells.append(Text("● ", style="bold") + safe.text(text))
                else:  # a str cell would be read as markup: the host's strings as Text
                    cell = safe.text(text)
                    if c.right:
                        cell.justify = "right"
                    cells.append(cell)
            table.add_row(*cells, key=r.run_id)
        ids = [r.run_id for r in self.shown]
        if keep in ids:
            table.move_cursor(row=ids.index(keep))
        self._title(len(plan))

    def _title(self, columns: int) -> None:
        t = Text(" Runs", style="bold")
        t.append(f" · {len(self.shown)} of {len(self.runs)} · sort: {self.sort}")
        if self.reverse:
            t.append(" reversed")
        if self.filter_text:
            t.append(" · filter: ")
            t.append(safe.text(self.filter_text))  # the operator's words, as typed
        hidden = len(self.SHOWN) - columns
        if hidden:
            t.append(f" · {hidden} more column{'s' if hidden != 1 else ''} wider", "dim")
        t.append(
            "\n Enter open · space mark · c compare · / filter · s/S sort/reverse · a latest",
            style="dim",
        )
        self.query_one("#runs-title", Label).update(t)

    def apply_filter(self, text: str) -> str | None:
        """The filter bar's text on the list; why not, in one line."""
        try:
            runs_view.parse_filter(text)
        except runs_view.RunsViewError as e:
            return str(e).removeprefix("--filter ")
        self.filter_text = text
        self.fill(keep=self._cursor_run())
        return None

    def action_filter(self) -> None:
        self.query_one(FilterBar).open(self.filter_text)

    def action_sort(self) -> None:
        keys = list(runs_view.SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.fill(keep=self._cursor_run())

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.fill(keep=self._cursor_run())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_latest(self) -> None:
        self.dismiss("latest")

    def action_mark(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        row_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        run_id = str(row_key.value)
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
        cell = safe.text(run_id)
        if run_id in self.marked:  # marked: "● " before the id, in the order marked
            cell = Text("● ", style="bold") + cell
        table.update_cell(row_key, self.id_column, cell, update_width=True)
        table.move_cursor(row=table.cursor_row + 1)  # mark the next one with the next space

    def action_compare(self) -> None:
        if len(self.marked) < 2:
            self.app.notify("mark two or more runs with space to compare them", severity="warning")
            return
        self.dismiss(list(self.marked))
