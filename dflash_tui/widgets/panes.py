"""The dashboard's boxes as panes: Tab/shift-Tab move between them (the focused one's
border lights up), `z` zooms the focused one to the whole screen, and `j k g G` scroll
whatever lists there (a pane's body, the step log, the stack viewer, the help).

vim's keys are bound on the scrolling widget itself, so they win over the app's keys only
where there is something to scroll: the app's own keys never use j, g or G, and kill is `K`
(shift) so that `k` can scroll everywhere."""

from __future__ import annotations

from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget

# Shown in the help, not the footer: the footer keeps its room for the app's keys.
VIM_SCROLL: list[BindingType] = [
    Binding("j", "scroll_down", "down", show=False),
    Binding("k", "scroll_up", "up", show=False),
    Binding("g", "scroll_home", "top", show=False),
    Binding("G", "scroll_end", "bottom", show=False),
]


class VimScroll(VerticalScroll):
    """A scrolling column that also answers j k g G."""

    BINDINGS = VIM_SCROLL


class Pane(VimScroll, can_focus=True):
    """A titled box whose body scrolls when it is taller than the box (the title, docked,
    stays); it can be focused and zoomed."""

    ALLOW_MAXIMIZE = True


class Box(Vertical):
    """A titled box whose body is its own focusable scroller (the step log): the box is what
    `z` zooms."""

    ALLOW_MAXIMIZE = True


def box_of(widget: Widget | None) -> Widget | None:
    """The pane `widget` is in (or is): what `z` zooms."""
    node = widget
    while isinstance(node, Widget):
        if isinstance(node, Pane | Box):
            return node
        node = node.parent  # type: ignore[assignment]
    return None
