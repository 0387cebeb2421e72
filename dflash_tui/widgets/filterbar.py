"""`/`: the step log's filter, typed in a line docked at the bottom over the footer, the
dashboard still in view. The log follows the pattern as it is typed; Enter keeps it, Esc
puts back the one before. A pattern that is not a regular expression is said in one line
beside the input, and the log keeps the last good one."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Footer, Input, Static

from dflash_tui.widgets import safe


class FilterBar(Horizontal):
    BINDINGS = [Binding("escape", "cancel", "cancel", show=False)]
    DEFAULT_CSS = """
    FilterBar { dock: bottom; height: 1; display: none; background: $panel; }
    FilterBar.-open { display: block; }
    FilterBar #filter-label { width: auto; padding: 0 1; color: $primary; text-style: bold; }
    FilterBar Input, FilterBar Input:focus { width: 1fr; height: 1; border: none; padding: 0; }
    FilterBar #filter-error { width: auto; max-width: 75%; padding: 0 1; color: $error; }
    """

    def __init__(
        self,
        apply: Callable[[str], str | None],
        placeholder: str = "regex, case-insensitive · Enter · Esc",
        **kw: object,
    ) -> None:
        """`apply(pattern)`: filters the log (or a list: the runs screen) by it, or returns
        why it cannot (one line)."""
        super().__init__(**kw)  # type: ignore[arg-type]
        self.apply = apply
        self.placeholder = placeholder
        self.before = ""  # the filter when the bar opened: what Esc puts back
        self._back_to: Widget | None = None  # the focus when it opened

    def compose(self) -> ComposeResult:
        yield Static(Text("/"), id="filter-label")
        yield Input(id="filter-input", placeholder=self.placeholder)
        yield Static(id="filter-error")

    def open(self, current: str) -> None:
        self.before = current
        self._back_to = self.screen.focused
        self.add_class("-open")
        self._show_footer(False)
        field = self.query_one(Input)
        field.value = current
        field.cursor_position = len(current)
        self._say(None)
        field.focus()

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def _say(self, error: str | None) -> None:
        self.query_one("#filter-error", Static).update(safe.text(error or ""))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.is_open:
            self._say(self.apply(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        error = self.apply(event.value)
        if error is None:
            self._close()
        else:
            self._say(error)  # stays open to be fixed, or Esc

    def action_cancel(self) -> None:
        self.apply(self.before)
        self._close()

    def _close(self) -> None:
        self.remove_class("-open")
        self._show_footer(True)
        if self._back_to is not None and self._back_to.is_attached:
            self._back_to.focus()
        else:
            self.screen.set_focus(None)

    def _show_footer(self, shown: bool) -> None:
        # The bar takes the footer's line: the panes above keep theirs.
        for footer in self.screen.query(Footer):
            footer.display = shown
