"""The threads list (T) sorts and filters as k9s's and htop's lists do (issue 32, "filter
and sort in the runs and threads lists"): `s` steps through pipeline order, CPU, name, time in
state and loop period; `/` keeps the rows matching every word typed. On a heartbeat a real
CPU run wrote (tests/fixtures/heartbeats/training-cpu.json), in the pure rows and through the
real app under Pilot."""

from __future__ import annotations

import asyncio

from test_thread_table import recorded_store
from textual.pilot import Pilot
from textual.widgets import DataTable

from dflash_tui import thread_table
from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.thread_table import ThreadsScreen


def test_sorts_and_filters_of_a_real_heartbeats_threads() -> None:
    rows = thread_table.thread_rows(recorded_store())
    by = {key: thread_table.sort_rows(rows, [], key)[0] for key in thread_table.SORTS}
    assert by["pipeline"] == rows
    assert [r.name for r in by["name"]] == sorted(r.name for r in rows)
    cpu = [r.cpu_pct for r in by["cpu"]]
    assert cpu == sorted(cpu, reverse=True) and cpu[0] > cpu[-1]
    waited = [r.in_state_s for r in by["in state"]]
    assert waited == sorted(waited, reverse=True)
    loops = [r.period_ms for r in by["loop"] if r.period_ms is not None]
    assert loops == sorted(loops, reverse=True) and len(loops) >= 5
    assert by["loop"][-1].period_ms is None  # a thread without a loop comes last

    drafters, _ = thread_table.filter_rows(rows, [], "DRAFTER")
    assert {r.name for r in drafters} == {"drafter-0", "drafter-1"}
    waiting, _ = thread_table.filter_rows(rows, [], "q_hs full")  # every word
    assert [r.name for r in waiting] == ["target-1"]
    assert thread_table.filter_rows(rows, [], "")[0] == rows
    assert thread_table.filter_rows(rows, [], "nothing-like-it")[0] == []


async def open_threads(app: DFlashApp, pilot: Pilot[None]) -> ThreadsScreen:
    """The recorded heartbeat in the app's store, then `T`: its threads screen."""
    recorded = recorded_store()
    app.store.heartbeat, app.store.run_id = recorded.heartbeat, recorded.run_id
    app.store.version += 1
    await pilot.press("T")
    await pilot.pause(0.3)
    screen = app.screen
    assert isinstance(screen, ThreadsScreen)
    return screen


def local_app() -> DFlashApp:
    return DFlashApp(Target(name="local", kind="local"), theme_name="dark", connect=False)


def test_the_threads_screen_sorts_and_filters_under_pilot() -> None:
    async def go() -> None:
        app = local_app()
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_threads(app, pilot)

            def names() -> list[str]:
                return [k.removeprefix("thread:") for k in screen.rows if k.startswith("thread:")]

            pipeline = names()
            assert pipeline[:2] == ["prefetch-0", "prefetch-1"]
            await pilot.press("s", "s")  # CPU, then name
            assert names() == sorted(pipeline)
            assert "sorted by name (s)" in str(screen.query_one("#group").render())

            await pilot.press("slash", *"target", "enter")
            assert names() == ["target-0", "target-1"]  # by name still, filtered
            assert "filter target" in str(screen.query_one("#group").render())
            await pilot.press("slash", "ctrl+u", *"waits", "escape")  # Esc: the one before
            assert names() == ["target-0", "target-1"]
            await pilot.press("s", "s", "s")  # in state, loop, back to the pipeline's order
            await pilot.press("slash", "ctrl+u", "enter")
            assert names() == pipeline

    asyncio.run(go())


def test_n_and_n_step_through_the_rows_matching_the_filter_under_pilot() -> None:
    """n / N (as in every viewer) move the cursor to the next / previous row whose name,
    role or state holds the filter's words, round the ends, and say which of how many."""

    async def go() -> None:
        app = local_app()
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_threads(app, pilot)
            table = screen.query_one(DataTable)

            def at() -> str:
                return list(screen.rows)[table.cursor_row].removeprefix("thread:")

            def said() -> str:
                return list(app._notifications)[-1].message

            await pilot.press("n")
            assert said().startswith("nothing to match yet")
            await pilot.press("slash", *"drafter", "enter")
            assert at() == "drafter-0"
            await pilot.press("n")
            assert (at(), said()) == ("drafter-1", "/drafter: row 2 of 2 · n / N")
            await pilot.press("n")  # round the end
            assert (at(), said()) == ("drafter-0", "/drafter: row 1 of 2 · n / N")
            await pilot.press("N")  # round the start
            assert (at(), said()) == ("drafter-1", "/drafter: row 2 of 2 · n / N")
            # The filter keeps target-0 by the queue it waits on; n matches target-1 alone,
            # by its state ("waiting: q_hs full").
            await pilot.press("slash", "ctrl+u", *"q_hs", "enter")
            assert [k.removeprefix("thread:") for k in screen.rows] == ["target-0", "target-1"]
            table.move_cursor(row=0)
            await pilot.press("n")
            assert (at(), said()) == ("target-1", "/q_hs: row 1 of 1 · n / N")
            await pilot.press("N")
            assert at() == "target-1"
            await pilot.press("slash", "ctrl+u", *"cpu", "enter")  # every row, by its device
            await pilot.press("n")
            assert said() == "/cpu: no row's name, role or state matches"

    asyncio.run(go())
