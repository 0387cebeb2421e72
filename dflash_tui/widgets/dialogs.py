"""The dialog for a command that acts on the run and cannot be taken back (kill, clear the
compile cache, a signal to one process): it confirms only when the operator types one of its
words into its line and presses Enter. A letter or an Enter typed into the wrong place
never confirms; Esc cancels, anything else typed is said not to be a word it takes.

It answers the word typed (as the dialog spells it), or None when cancelled."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from dflash_tui.widgets import safe


class TypedConfirm(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    TypedConfirm { align: center middle; }
    TypedConfirm > Vertical { width: 90; max-width: 100%; height: auto; max-height: 100%;
                              border: thick $warning; background: $surface; padding: 1 2; }
    TypedConfirm Input { margin-top: 1; }
    TypedConfirm #said { height: auto; }
    """

    def __init__(self, question: str, words: tuple[str, ...], what: str = "") -> None:
        """`words`: what confirms (one of them, whole, case-insensitive); `what`: the line
        under the question saying what each word does, when there are several."""
        super().__init__()
        self.question, self.words, self.what = question, words, what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(safe.text(self.question))  # it names runs and processes by their ids
            if self.what:
                yield Static(Text(self.what))
            # The line under it says what to type; the empty input shows only the word(s),
            # so the instruction is not read twice.
            yield Input(placeholder=" or ".join(self.words), id="word")
            yield Static(Text(self.prompt() + " · Esc cancels", style="dim"), id="said")

    def prompt(self) -> str:
        typed = " or ".join(f"'{w}'" for w in self.words)
        return f"type {typed} and Enter to confirm"

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        typed = event.value.strip().lower()
        for word in self.words:
            if typed == word.lower():
                self.dismiss(word)
                return
        # Not a word it takes: said, and the line emptied for the next try.
        shown = safe.text(event.value, limit=40)
        said = Text("not confirmed: ", style="bold yellow") + shown + Text(f" · {self.prompt()}")
        self.query_one("#said", Static).update(said)
        event.input.value = ""

    def action_cancel(self) -> None:
        self.dismiss(None)
