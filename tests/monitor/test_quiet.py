"""widgets/quiet.py: a pane repaints when what it shows changed, and only then."""

from __future__ import annotations

import asyncio

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from dflash_tui.widgets import quiet


class One(App[None]):
    def compose(self) -> ComposeResult:
        yield Static(id="pane")


def table(age: str, colour: str = "green") -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(style="dim", width=12)
    t.add_column()
    t.add_row("heartbeat", Text(f"{age} ago", style=colour))
    return t


def test_the_same_content_is_not_repainted_a_change_of_text_or_colour_is():
    async def go():
        app = One()
        async with app.run_test() as pilot:
            pane = app.query_one("#pane", Static)
            assert quiet.update(pane, table("3s"))
            assert not quiet.update(pane, table("3s"))  # a new, equal table
            assert quiet.update(pane, table("4s"))
            assert quiet.update(pane, table("4s", "red"))  # the base style counts
            assert not quiet.update(pane, table("4s", "red"))
            await pilot.pause(0.1)
            screen = "".join(
                seg.text for strip in app.screen._compositor.render_strips() for seg in strip
            )
            assert "4s ago" in screen
            assert quiet.update(pane, Group(Text("a"), Text("b")))
            assert not quiet.update(pane, Group(Text("a"), Text("b")))
            assert quiet.update(pane, Group(Text("a"), Text("c")))

    asyncio.run(go())
