"""The thread/process table (T): host meters, then a row per trainer thread and a row per
process of the run's proven group, htop style; `s` sorts by the next key (CPU, name, time in
state, loop; thread_table.SORTS), `/` filters by words, `n` / `N` move to the next / previous
row whose name, role or state holds them (round the ends), j/k or the arrows move.

A viewer (dflash_tui/widgets/keys.py): nothing here sends a request without a typed word. Enter on
a thread row shows that thread's section of the newest stack dump taken (d on the
dashboard); Enter on a process row asks for a signal's name, typed (SIGTERM, SIGKILL,
SIGUSR2: a stack dump; widgets/dialogs.py), and sends it through the agent, which refuses
it unless the pid is still the one listed, in the run's proven group
(dflash_tui/agent/proc_table.py). The rows come from dflash_tui/thread_table.py; every
string in them is the host's: cells are `Text` from widgets/safe.py.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from dflash_tui import control, thread_table
from dflash_tui.fmt import duration, size
from dflash_tui.stages import ms_text
from dflash_tui.widgets import safe
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.filterbar import FilterBar
from dflash_tui.widgets.footer import Footer
from dflash_tui.widgets.screens import TextScreen
from trainer.contract.protocol import MAX_PROC_NAME, PROCESS_SIGNALS, ProcInfo

COLUMNS = ("", "name", "role", "device", "state", "for", "CPU %", "RSS", "slowest stage", "loop")
WAITS_COLUMN = "waits on"
REFRESH_S = 1.0
# Which columns give way first on a narrow terminal (the highest number first): the name,
# its CPU and what it does now stay; the kind letter (T/P), the device, the loop go first.
# `a` shows every column, the table then scrolling sideways (← →).
PRIORITY = {
    "name": 0,
    "CPU %": 1,
    "state": 2,
    "role": 3,
    WAITS_COLUMN: 4,
    "for": 5,
    "slowest stage": 6,
    "RSS": 7,
    "loop": 8,
    "device": 9,
    "": 10,
}
NAME_NARROW = 28  # a process's command line is cut to this before any column is dropped
CELL_PAD = 2  # DataTable's cell padding, both sides


def fitted(widths: list[int], width: int) -> tuple[list[int], int | None]:
    """The columns (their indices, in table order) whose natural `widths` fit in `width`
    cells, dropping the least important first; and the name column's width when it is cut
    (None: its own)."""
    headers = [*COLUMNS, WAITS_COLUMN]
    shown = list(range(len(headers)))
    name = headers.index("name")

    def total(cols: list[int], name_w: int) -> int:
        return sum((name_w if i == name else widths[i]) + CELL_PAD for i in cols)

    if total(shown, widths[name]) <= width:
        return shown, None
    name_w = min(widths[name], max(NAME_NARROW, width - total([i for i in shown if i != name], 0)))
    for i in sorted(shown, key=lambda i: -PRIORITY[headers[i]]):
        if total(shown, name_w) <= width or i == name:
            break
        shown.remove(i)
    return shown, name_w if name_w < widths[name] else None


def _thread_cells(r: thread_table.ThreadRow) -> tuple[Any, ...]:
    slowest = f"{r.slowest.name} {ms_text(r.slowest.ms)}" if r.slowest else ""
    return (
        Text("T", style="cyan"),
        safe.text(r.name, limit=40),
        safe.text(r.role, limit=20),
        safe.text(r.device, limit=20),
        safe.text(r.state, limit=40),
        duration(r.in_state_s),
        f"{r.cpu_pct:5.1f}",
        "",
        safe.text(slowest, limit=40),
        ms_text(r.period_ms) if r.period_ms else "",
        safe.text(r.waits_on, limit=30),
    )


def _proc_cells(r: thread_table.ProcRow) -> tuple[Any, ...]:
    p = r.info
    return (
        Text("P", style="magenta"),
        safe.text(f"{p.pid} {p.name}", limit=MAX_PROC_NAME + 8),
        r.role,
        "",
        safe.text(p.state, limit=2),
        "",
        "" if p.cpu_pct is None else f"{p.cpu_pct:5.1f}",
        size(p.rss),
        "",
        f"{p.threads} thread{'s' if p.threads != 1 else ''}" if p.threads else "",
        "",
    )


# SIGUSR2's dump is faulthandler's, run in a C signal handler while the other threads go on:
# it reads their frames as they change, and CPython says it can crash the process then
# (python/cpython#116008; a tiny run here died of SIGSEGV so, its drafter in AdamW). `d` asks
# for the named dump first and falls back to SIGUSR2 only when that never comes (stuck).
SIGNAL_WHAT = (
    "SIGTERM: the trainer stops at its next step and checkpoints · SIGKILL: at once, no "
    "checkpoint · SIGUSR2: faulthandler's stack dump, for a run stuck in C code; it can "
    "crash a run that is not stuck (`d` dumps safely)"
)


class ThreadsScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "back"),
        Binding("s", "sort", "sort"),
        Binding("slash", "filter", "filter"),
        Binding("n", "next_match", "next match"),
        Binding("N", "previous_match", "previous match"),
        Binding("a", "all_columns", "all columns"),
        Binding("j", "down", "down", show=False),
        Binding("k", "up", "up", show=False),
    ]
    DEFAULT_CSS = """
    ThreadsScreen #meters { background: $panel; padding: 0 1; height: auto; }
    ThreadsScreen #group { padding: 0 1; color: $text-muted; height: auto; }
    ThreadsScreen DataTable { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.sort = thread_table.SORTS[0]
        self.filter_text = ""
        self.all_columns = False  # `a`: every column, scrolled sideways, none dropped
        self._drawn: tuple[int, str, str, int, bool] | None = None
        self._columns: tuple[tuple[int, ...], int | None] | None = None
        self.rows: dict[str, thread_table.ThreadRow | thread_table.ProcRow] = {}

    @property
    def dapp(self) -> Any:
        """The DFlashApp (its store, link and control runner); typed loosely: a widget may
        not import the app."""
        return self.app

    def compose(self) -> ComposeResult:
        yield Static(id="meters")
        yield Static(id="group")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="threads")
        yield FilterBar(self.apply_filter, placeholder="words, case-insensitive · Enter · Esc")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self.refresh_rows()
        self.set_interval(REFRESH_S, self.refresh_rows)
        table.focus()

    def refresh_rows(self, force: bool = False) -> None:
        store = self.dapp.store
        self.query_one("#meters", Static).update(Text("\n".join(thread_table.meters(store.host))))
        state = (store.version, self.sort, self.filter_text, self.size.width, self.all_columns)
        if not force and state == self._drawn:
            return
        self._drawn = state
        threads, procs = thread_table.thread_rows(store), thread_table.proc_rows(store)
        threads, procs = thread_table.filter_rows(threads, procs, self.filter_text)
        threads, procs = thread_table.sort_rows(threads, procs, self.sort)
        table = self.query_one(DataTable)
        keep = self._cursor_key(table)
        rows: list[thread_table.ThreadRow | thread_table.ProcRow] = [*threads, *procs]
        cells = [
            _thread_cells(r) if isinstance(r, thread_table.ThreadRow) else _proc_cells(r)
            for r in rows
        ]
        headers = [*COLUMNS, WAITS_COLUMN]
        widths = [
            max([len(h)] + [Text(c).cell_len if isinstance(c, str) else c.cell_len for c in col])
            for h, col in zip(
                headers, zip(*cells, strict=True) if cells else [()] * len(headers), strict=True
            )
        ]
        room = (self.size.width or 1000) - 2  # its vertical scrollbar
        shown, name_w = (
            (list(range(len(headers))), None) if self.all_columns else fitted(widths, room)
        )
        columns = (tuple(shown), name_w)
        if columns != self._columns:  # the column set changed: the table anew
            self._columns = columns
            table.clear(columns=True)
            for i in shown:
                cut = name_w if headers[i] == "name" else None
                table.add_column(headers[i], width=cut, key=headers[i] or "kind")
        else:
            table.clear()
        self.rows = {}
        for r, row in zip(rows, cells, strict=True):
            table.add_row(*(row[i] for i in shown), key=r.key)
            self.rows[r.key] = r
        note = safe.text(thread_table.group_note(store))
        note.append(f"  · sorted by {self.sort} (s)", style="dim")
        if self.filter_text:
            note.append("  · filter ")
            note.append(safe.text(self.filter_text))  # the operator's words, as typed
        hidden = [headers[i] or "T/P" for i in range(len(headers)) if i not in shown]
        if hidden or name_w is not None:  # what the narrow terminal left out, and the way back
            said = [f"left out: {', '.join(hidden)}"] if hidden else []
            said += [f"names cut to {name_w}"] if name_w is not None else []
            note.append(f"  ·  {'; '.join(said)} (a: every column)", "bold")
        elif self.all_columns:
            note.append("  ·  every column: ← → scroll sideways", "bold")
        self.query_one("#group", Static).update(note)
        if keep in self.rows:
            table.move_cursor(row=list(self.rows).index(keep))

    @staticmethod
    def _cursor_key(table: DataTable[Any]) -> str | None:
        if table.row_count == 0:
            return None
        try:
            return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        except Exception:  # no row under the cursor
            return None

    def action_sort(self) -> None:
        keys = thread_table.SORTS
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.refresh_rows(force=True)
        self.dapp.notify(f"sorted by {self.sort}", timeout=2)

    def action_filter(self) -> None:
        self.query_one(FilterBar).open(self.filter_text)

    def apply_filter(self, text: str) -> str | None:
        self.filter_text = text
        self.refresh_rows(force=True)
        return None

    def action_next_match(self) -> None:
        self.step_match(1)

    def action_previous_match(self) -> None:
        self.step_match(-1)

    def step_match(self, by: int) -> None:
        """The cursor to the next (1) or previous (-1) row matching the filter's words by
        its name, role or state, round the ends, and where it is said ("row k of N")."""
        words = self.filter_text
        if not words.strip():
            self.dapp.notify("nothing to match yet: / and words first", timeout=3)
            return
        rows = list(self.rows.values())
        matches = [i for i, r in enumerate(rows) if thread_table.row_matches(r, words)]
        said = safe.text(f"/{words}: ").plain  # the operator's words: no escapes, no markup
        if not matches:
            self.dapp.notify(f"{said}no row's name, role or state matches", markup=False)
            return
        table = self.query_one(DataTable)
        k = thread_table.next_match(matches, table.cursor_row, by)
        table.move_cursor(row=matches[k])
        self.dapp.notify(f"{said}row {k + 1} of {len(matches)} · n / N", markup=False)

    def on_resize(self) -> None:
        self.refresh_rows()

    def action_all_columns(self) -> None:
        self.all_columns = not self.all_columns
        self.refresh_rows(force=True)
        self.dapp.notify(
            "every column: ← → scroll sideways" if self.all_columns else "columns fitted",
            timeout=2,
        )

    def action_down(self) -> None:
        self.query_one(DataTable).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(DataTable).action_cursor_up()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        row = self.rows.get(str(event.row_key.value))
        if isinstance(row, thread_table.ThreadRow):
            self.show_stack(row.name)
        elif isinstance(row, thread_table.ProcRow) and row.signalled:
            self.offer_signal(row.info, row.role == thread_table.PROC_TRAINER)
        elif isinstance(row, thread_table.ProcRow):
            self.dapp.notify(
                f"pid {row.info.pid} is the launch wrapper, in a process group of its own: "
                "not signalled from here (K on the dashboard stops the run; the wrapper then "
                "exits)",
                severity="warning",
                timeout=8,
            )

    def show_stack(self, name: str) -> None:
        """`name`'s part of the newest stack dump held; taking one is the dashboard's (d)."""
        app = self.dapp
        st = app.controls.last_stacks
        if st is None or (st.run_id and st.run_id != app.store.run_id):
            app.notify(
                f"no stack dump of run {app.store.run_id} yet: d on the dashboard takes one "
                "(SIGUSR1), then Enter here shows this thread's part",
                severity="warning",
                timeout=8,
            )
            return
        section = thread_table.thread_section(st.text, name)
        body = (
            section
            if section is not None
            else f"# thread {name!r} is not in this dump (it has ended?): the whole dump\n"
            + st.text
        )
        age = duration(max(0.0, app.clock() - app.controls.last_stacks_at))
        app.push_screen(
            TextScreen(f"Stack of thread {name} — pid {st.pid}, {st.path}, {age} ago", body)
        )

    def offer_signal(self, p: ProcInfo, leader: bool) -> None:
        app = self.dapp
        store = app.store
        what = "the run's trainer" if leader else "a process of the run's group"
        question = (
            f"Signal pid {p.pid} ({p.name}), {what} (run {store.run_id})? The agent sends it "
            f"only if pid {p.pid} still lives, started at the same tick ({p.start}), in the "
            "run's proven process group."
        )

        async def run() -> None:
            choice = await app.push_screen_wait(
                TypedConfirm(question, PROCESS_SIGNALS, SIGNAL_WHAT)
            )
            if choice is None:
                return
            done = await control.signal_process(
                app.link, p.pid, p.start, choice, run_id=store.run_id
            )
            app.notify(done.message, title="signal", timeout=8)

        app.controls.start("signal", run)
