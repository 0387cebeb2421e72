"""Modal screens: confirm, restart's choice, a scrollable text (stack dumps), help, the
filter, the runs."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from dflash_tui.evaluation import best_tau
from dflash_tui.facts import run_outcome
from dflash_tui.widgets import safe
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


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 90; height: auto; border: thick $warning;
                               background: $surface; padding: 1 2; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(safe.text(self.question))  # it names runs by their ids
            yield Static(Text("\ny = yes    n / esc = no", style="dim"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class RestartScreen(ModalScreen[str | None]):
    """Restart's choice: "resume" (the newest good checkpoint), "fresh" (step 0), or None
    (cancel), by key or button. The labels quote the host (run ids, checkpoint names, why
    one was skipped): Text, never markup."""

    BINDINGS = [
        Binding("r", "choose('resume')", "resume"),
        Binding("f", "choose('fresh')", "fresh"),
        Binding("n,escape", "choose('')", "cancel"),
    ]
    DEFAULT_CSS = """
    RestartScreen { align: center middle; }
    RestartScreen > Vertical { width: 100; height: auto; border: thick $warning;
                               background: $surface; padding: 1 2; }
    RestartScreen Horizontal { height: auto; margin-top: 1; }
    RestartScreen Button { margin-right: 2; }
    """

    def __init__(self, question: str, resume_label: str, detail: str = "") -> None:
        super().__init__()
        self.question, self.resume_label, self.detail = question, resume_label, detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(safe.text(self.question))
            if self.detail:
                yield Static(safe.text(self.detail, "dim"), id="detail")
            with Horizontal():
                yield Button(safe.text(self.resume_label), id="resume", variant="primary")
                yield Button(Text("Start fresh (step 0)"), id="fresh")
                yield Button(Text("Cancel"), id="cancel")
            yield Static(Text("\nr = resume    f = fresh    n / esc = cancel", style="dim"))

    def on_mount(self) -> None:
        self.query_one("#resume", Button).focus()  # Enter resumes: the default

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id or "")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice if choice in ("resume", "fresh") else None)


class TextScreen(Screen[None]):
    """A full screen of text the host wrote (a stack dump, py-spy's output), scrollable;
    escape or q goes back."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "back")]
    DEFAULT_CSS = """
    TextScreen VerticalScroll { padding: 0 1; }
    TextScreen #title { background: $panel; padding: 0 1; text-style: bold; }
    """

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text, self.body = title, text

    def compose(self) -> ComposeResult:
        yield Static(safe.text(self.title_text), id="title")
        with VerticalScroll():
            yield Static(safe.log_text(self.body), id="body")
        yield Footer()


HELP = """\
r   restart the run (kill, wait for GPU memory, launch the same config): resume from
    its newest good checkpoint, or start fresh from step 0   asks which
k   kill the run (SIGTERM its process group, then SIGKILL), shows the drain   asks first
d   dump every thread's stack (SIGUSR1; py-spy too where installed)
c   clear the compile cache (refused while a run is alive)   asks first
l   choose a run (Enter on a row); the latest run is followed by default
/   filter the step log (empty filter = all lines)
f   follow / pause the step log
p   replay the run's telemetry with these panes: ←/→ an entry, [/] a minute, home/end,
    e the end; control keys are off there; escape returns to live
t   next theme (dark, light, high-contrast, …); remembered
?   this help
q   quit: the remote run is left alone
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 90; height: auto; border: thick $primary;
                          background: $surface; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("dflash-tui keys\n\n", style="bold") + Text(HELP))


class FilterScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    FilterScreen { align: center bottom; }
    FilterScreen Input { width: 80; margin-bottom: 3; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        yield Input(value=self.current, placeholder="filter the step log (Enter)", id="filter")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RunsScreen(ModalScreen[str | None]):
    """Runs under the run root, with how each ended (the outcome's words); Enter picks one."""

    BINDINGS = [Binding("escape,q", "cancel", "back"), Binding("a", "latest", "follow latest")]
    DEFAULT_CSS = """
    RunsScreen { align: center middle; }
    RunsScreen > Vertical { width: 140; height: 80%; border: thick $primary;
                            background: $surface; }
    RunsScreen DataTable { height: 1fr; }
    """

    def __init__(self, runs: list[RunInfo], current: str | None) -> None:
        super().__init__()
        self.runs, self.current = runs, current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                Text(
                    " Runs — Enter: show this run · a: follow the latest · esc: back", style="bold"
                )
            )
            yield DataTable(cursor_type="row", id="runs")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("run id", "outcome", "phase", "steps", "best tok/s", "best τ", "error")
        for r in reversed(self.runs):
            outcome = run_outcome(r)
            ended = safe.text(outcome.summary[:60], OUTCOME_STYLE.get(outcome.kind, "dim"))
            best = r.best_tok_s
            table.add_row(  # a str cell would be read as markup: the host's strings as Text
                safe.text(r.run_id),
                ended,
                safe.text(r.phase or "—"),
                str(r.steps),
                f"{best:,.0f}" if best else "—",
                best_tau(r),
                safe.text((r.error or "")[:50]),
                key=r.run_id,
            )
        if self.current:
            for i, r in enumerate(reversed(self.runs)):
                if r.run_id == self.current:
                    table.move_cursor(row=i)
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_latest(self) -> None:
        self.dismiss("latest")
