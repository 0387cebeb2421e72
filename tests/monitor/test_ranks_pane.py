"""The ranks pane under Pilot, fed what a monitor receives from a real processes-mode job
(tests/fixtures/ranks/slow-drafter: drafter rank 3 slowed with DFLASH_FAULT): a row per
rank with its numbers and the straggler marked; hidden for a threads-mode run and on a
terminal too short for it; a hostile host name shown as text, never as markup or escapes."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import pytest
from app_scenarios import healthy
from monitor_helpers import typed_event
from rank_fixtures import Beats, events, now_of, recorded
from rich.console import Console

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.ranks import RanksPane

TARGET = Target(name="cpu-box", kind="ssh", host="cpu-box")
CONNECTED = {"type": "link", "state": "connected", "target": "cpu-box", "version": 3}


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def plain(widget: Any, width: int = 158) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


async def shown(
    name: str, size: tuple[int, int], *edits: Any, expect_box: bool = True
) -> tuple[bool, str]:
    """(whether the ranks box is on screen, the pane's text) once the panes have drawn:
    the rows written, then the layout that shows the box applied (`expect_box`), or a
    layout pass later (a box that must stay hidden)."""
    app = DFlashApp(TARGET, connect=False, clock=lambda: now_of(name))
    async with app.run_test(size=size) as pilot:
        app.feed(typed_event({**CONNECTED, "t": now_of(name)}))
        for e in events(name, *edits):
            app.feed(typed_event(e))
        pane = app.query_one(RanksPane)
        box = app.query_one("#ranks-box")

        def on_screen() -> bool:
            return bool(box.display and box.region.height > 0)

        deadline = time.monotonic() + 5
        while "drafter 1" not in plain(pane) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        if expect_box:  # under load the layout can lag the rows by a frame or two
            while not on_screen() and time.monotonic() < deadline:
                await pilot.pause(0.1)
        else:
            await pilot.pause(0.3)
        return on_screen(), plain(pane)


def test_a_row_per_rank_with_the_straggler_marked() -> None:
    on_screen, text = asyncio.run(shown("slow-drafter", (160, 48)))
    assert on_screen, text
    _, ranks = recorded("slow-drafter")
    rows = {int(ln.split()[0]): ln for ln in text.splitlines() if ln.strip()[:1].isdigit()}
    assert sorted(rows) == [0, 1, 2, 3], text
    for rank, beat in ranks.items():
        row = rows[rank]
        role = f"{beat['role']} {beat['index']}"
        assert role in row and beat["host"][:10] in row and " training " in row, row
        assert f" {beat['step']} " in row, row
    assert rows[3].rstrip().endswith("straggler"), text
    assert not any(rows[r].rstrip().endswith("straggler") for r in (0, 1, 2)), text
    # compute vs comm: the straggler computes, its peer drafter waits at the all-reduce.
    (compute3, comm3), (compute2, comm2) = ms_cells(rows[3]), ms_cells(rows[2])
    assert compute3 > 1.5 * compute2 and comm2 > comm3, (rows[3], rows[2])


def ms_cells(row: str) -> list[int]:
    """The row's `N ms` cells: compute, then comm."""
    cells = row.split()
    return [int(cells[i - 1]) for i, c in enumerate(cells) if c == "ms"]


def test_no_ranks_pane_for_a_threads_mode_run() -> None:
    async def go() -> bool:
        app = DFlashApp(TARGET, connect=False, clock=lambda: 0.0)
        async with app.run_test(size=(160, 48)) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            await pilot.pause(0.5)
            return bool(
                app.query_one("#ranks-box").display and app.query_one("#ranks-box").region.height
            )

    assert not asyncio.run(go())


def test_no_room_on_a_short_terminal() -> None:
    on_screen, _ = asyncio.run(shown("slow-drafter", (80, 24), expect_box=False))
    assert not on_screen


def test_a_hostile_host_name_is_shown_as_text() -> None:
    """Edit: rank 3's `host` set to a string with an escape sequence and Rich markup."""

    def hostile(ranks: Beats) -> None:
        ranks[3]["host"] = "\x1b[31mevil[bold]"

    _, text = asyncio.run(shown("slow-drafter", (160, 48), hostile))
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("3 "))
    assert "\\x1b[31mevil" in row and "\x1b" not in text, row


def test_an_unreadable_rank_keeps_the_other_rows_whole() -> None:
    """Edit: rank 1's `stages_ms` given a 300-character stage name whose time is a string:
    the reader's reason quotes that path, longer than the pane is wide."""

    def torn(ranks: Beats) -> None:
        ranks[1]["stages_ms"] = {"x" * 300: "fast"}

    _, text = asyncio.run(shown("slow-drafter", (160, 48), torn))
    rows = {int(ln.split()[0]): ln for ln in text.splitlines() if ln.strip()[:1].isdigit()}
    assert "unreadable" in rows[1] and "stages_ms.xxx" in rows[1], text
    _, ranks = recorded("slow-drafter")
    assert ranks[0]["host"][:10] in rows[0] and " training " in rows[0], text
    assert len(ms_cells(rows[0])) == 2, rows[0]  # its compute and comm still shown
    # With one rank unknown, no rank is blamed: the others may be waiting for it.
    assert "straggler" not in text, text
