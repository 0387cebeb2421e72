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


class LogBesidePane(App[None]):
    """The step log (long lines, more than it shows: both scrollbars) beside a pane that
    changes, as the heartbeat pane's ages do once a second."""

    def compose(self) -> ComposeResult:
        from dflash_tui.widgets.steplog import StepLog

        yield Static(id="pane")
        yield StepLog(id="steplog")


def test_a_pane_that_changes_does_not_repaint_the_step_logs_scrollbars(monkeypatch):
    """Issue 32: Textual's ScrollView redrew its scrollbars at every layout anywhere on the
    screen (it compares the layout's virtual size with its lines', never equal), so each
    age that ticked repainted the log's scrollbar column and row with nothing new."""
    from textual.scrollbar import ScrollBar

    from dflash_tui.widgets.steplog import StepLog

    painted: list[str] = []
    render = ScrollBar.render

    def counted(bar: ScrollBar):  # type: ignore[no-untyped-def]
        if isinstance(bar.parent, StepLog):
            painted.append(bar.name or "")
        return render(bar)

    monkeypatch.setattr(ScrollBar, "render", counted)

    async def go():
        app = LogBesidePane()
        async with app.run_test(size=(80, 24)) as pilot:
            log = app.query_one(StepLog)
            for i in range(60):
                log.write(Text(f"step={i} " + "x" * 120))
            await pilot.pause(0.2)
            assert {"vertical", "horizontal"} <= set(painted)  # drawn, both
            painted.clear()
            pane = app.query_one("#pane", Static)
            for age in range(5):
                pane.update(f"heartbeat {age}s ago")  # a layout refresh each
                await pilot.pause(0.05)
            assert painted == []
            log.write(Text("step=60"))  # a new line: the bars move, and are drawn
            await pilot.pause(0.2)
            assert "vertical" in painted

    asyncio.run(go())


def test_an_ended_runs_ages_move_once_a_minute():
    from dflash_tui.fmt import duration

    assert [duration(s, minutes=True) for s in (0, 59.9, 60, 61, 3599, 3600, 7500)] == [
        "<1m",
        "<1m",
        "1m",
        "1m",
        "59m",
        "1h00m",
        "2h05m",
    ]
    assert duration(61) == "1m01s"  # a live run's, to the second
