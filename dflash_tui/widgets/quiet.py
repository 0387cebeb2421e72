"""Update a Static only when what it shows changed.

`Static.update` repaints its region and Textual writes that region to the terminal, equal
or not: a pane updated by every event (an RTT ping, a host sample) repainted the screen
several times a second with nothing new. `update` here compares a key of the renderable
first; text compares by content and every style, tables and groups by their cells.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

_NEVER = object()


def key(renderable: Any) -> Any:
    """A value equal for two renderables that draw the same; a fresh object (never equal)
    for a kind this does not know."""
    if isinstance(renderable, str):
        return renderable
    if isinstance(renderable, Text):
        # Not Text's own ==: it leaves out the base style (a bar's colour).
        return (
            "text",
            renderable.plain,
            str(renderable.style),
            tuple((s.start, s.end, str(s.style)) for s in renderable.spans),
            renderable.justify,
            renderable.overflow,
            renderable.no_wrap,
        )
    if isinstance(renderable, Table):
        return (
            "table",
            repr(renderable.padding),
            renderable.show_header,
            renderable.expand,
            tuple(
                (
                    col.width,
                    str(col.style),
                    col.justify,
                    col.no_wrap,
                    col.ratio,
                    tuple(key(cell) for cell in col._cells),
                )
                for col in renderable.columns
            ),
            tuple(str(row.style) for row in renderable.rows),
        )
    if isinstance(renderable, Group):
        return ("group", tuple(key(r) for r in renderable.renderables))
    if isinstance(renderable, Padding):
        return ("padding", renderable.top, renderable.left, key(renderable.renderable))
    return object()


def update(widget: Static, renderable: Any, **kw: Any) -> bool:
    """`widget.update(renderable, **kw)` unless it already shows the same; True when it did."""
    k = (key(renderable), tuple(sorted(kw.items())))
    if k == getattr(widget, "_quiet_key", _NEVER):
        return False
    widget._quiet_key = k  # type: ignore[attr-defined]
    widget.update(renderable, **kw)
    return True
