"""The `/` line, typed in a line docked at the bottom: `SlashBar`, one widget with the two
ways a view reads it.

- `FilterBar` (the step log's filter, the runs and threads lists): the view follows the
  pattern as it is typed; Enter keeps it, Esc puts back the one before. It takes the
  footer's line while open, the dashboard still in view.
- `SearchBar` (a viewer's search, widgets/search.py; the replay's filter): the pattern is
  tried on Enter only; Esc closes, the last search kept.

A pattern that cannot be used is said in one line beside the input, and the bar stays open
to be fixed (or Esc)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Input, Static

from dflash_tui.widgets import safe
from dflash_tui.widgets.footer import Footer


class SlashBar(Horizontal):
    """The line itself: `/`, the input, why the pattern cannot be used. `ROLE` names its
    parts (`#ROLE-label`, `#ROLE-input`, `#ROLE-error`)."""

    ROLE: ClassVar[str] = "filter"
    BINDINGS = [Binding("escape", "cancel", "cancel", show=False)]
    DEFAULT_CSS = """
    SlashBar { dock: bottom; height: 1; display: none; background: $panel; }
    SlashBar.-open { display: block; }
    SlashBar .slash-label { width: auto; padding: 0 1; color: $primary; text-style: bold; }
    SlashBar Input, SlashBar Input:focus { width: 1fr; height: 1; border: none; padding: 0; }
    SlashBar .slash-error { width: auto; max-width: 75%; padding: 0 1; color: $error; }
    """

    def __init__(self, placeholder: str = "regex, case-insensitive · Enter · Esc", **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.placeholder = placeholder
        self.before = ""  # the pattern when the bar opened
        self._back_to: Widget | None = None  # the focus when it opened

    def compose(self) -> ComposeResult:
        yield Static(Text("/"), id=f"{self.ROLE}-label", classes="slash-label")
        yield Input(id=f"{self.ROLE}-input", placeholder=self.placeholder)
        yield Static(id=f"{self.ROLE}-error", classes="slash-error")

    def open(self, current: str) -> None:
        self.before = current
        self._back_to = self.screen.focused
        self.add_class("-open")
        self._opened(True)
        field = self.query_one(Input)
        field.value = current
        field.cursor_position = len(current)
        self.say("")
        field.focus()

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def say(self, error: str | None) -> None:
        """Why the pattern cannot be used, beside it ("" or None: nothing)."""
        self.query_one(f"#{self.ROLE}-error", Static).update(safe.text(error or ""))

    def close(self) -> None:
        self.remove_class("-open")
        self._opened(False)
        if self._back_to is not None and self._back_to.is_attached:
            self._back_to.focus()
        else:
            self.screen.set_focus(None)

    def _opened(self, shown: bool) -> None:
        """What else changes while the bar is open (FilterBar: the footer gives way)."""


class FilterBar(SlashBar):
    def __init__(
        self,
        apply: Callable[[str], str | None],
        placeholder: str = "regex, case-insensitive · Enter · Esc",
        **kw: object,
    ) -> None:
        """`apply(pattern)`: filters the log (or a list: the runs screen) by it, or returns
        why it cannot (one line)."""
        super().__init__(placeholder, **kw)
        self.apply = apply

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.is_open:
            self.say(self.apply(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        error = self.apply(event.value)
        if error is None:
            self.close()
        else:
            self.say(error)  # stays open to be fixed, or Esc

    def action_cancel(self) -> None:
        self.apply(self.before)
        self.close()

    def _opened(self, shown: bool) -> None:
        # The bar takes the footer's line: the panes above keep theirs.
        for footer in self.screen.query(Footer):
            footer.display = not shown


class SearchBar(SlashBar):
    ROLE = "search"
    DEFAULT_CSS = "SearchBar .slash-error { max-width: 60%; }"

    def __init__(self, submit: Callable[[str], bool], **kw: Any) -> None:
        """`submit(pattern)`: searches; False keeps the bar open (it said why, `say`)."""
        super().__init__(**kw)
        self.submit = submit

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.submit(event.value):
            self.close()

    def action_cancel(self) -> None:
        self.close()
