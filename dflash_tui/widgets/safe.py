"""Strings from the training host as Rich `Text`: the one way a widget shows them.

A `str` handed to a `Static`, a `Table` cell, a `DataTable` cell or a toast is read as
markup (`[bold red]` in a log line would style it, `[/]` would raise), and Rich passes ESC,
C1 controls and bidi overrides to the terminal as they are. A `Text` built here is neither:
its control characters are made visible (dflash_tui/sanitize.py) and it is never parsed.

`limit`: a pane shows at most that many characters of one string, then how many it cut: a
megabyte-long log line must not cost the screen a second per redraw.
"""

from __future__ import annotations

from rich.text import Text

from dflash_tui import sanitize

FIELD_LIMIT = 4096  # one field or message in a pane
LINE_LIMIT = 4096  # one train.log line (a step line is ~200 characters)
TEXT_LIMIT = 4 << 20  # a whole text on its own screen (a stack dump, py-spy's output)


def text(value: str, style: str = "", newlines: bool = False, limit: int = FIELD_LIMIT) -> Text:
    """A string from the host, or a message that quotes one."""
    return Text(sanitize.field(value, newlines, limit), style=style)


def log_line(value: str, style: str = "", limit: int = LINE_LIMIT) -> Text:
    """One line the host wrote: a progress bar redrawn with CR shows its last state."""
    return Text(sanitize.line(value, limit), style=style)


def log_text(value: str, style: str = "", limit: int = TEXT_LIMIT) -> Text:
    """A text the host wrote, its lines kept (a stack dump)."""
    return Text(sanitize.lines(value, limit), style=style)
