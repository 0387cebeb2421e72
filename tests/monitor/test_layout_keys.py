"""The layout at every terminal size, and the keys that do what they say: the real app under
Pilot, fed the scripted streams the snapshots use, read as the screen's text."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from app_scenarios import NOW, RUN, alert_state, healthy
from monitor_helpers import typed_event
from rich.console import Console
from textual.color import Color

from dflash_tui import pager
from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.layout import plan
from dflash_tui.widgets.panes import Pane, VimScroll
from dflash_tui.widgets.screens import HelpScreen, RunsScreen, TextScreen
from dflash_tui.widgets.steplog import StepLog

TARGET = Target(name="gpu-box", kind="ssh", host="gpu-box")
SIZES = [(80, 24), (120, 40), (160, 48), (240, 60)]
NO_LINK_CALLED = object()  # a link no test here reaches: asked "no", nothing is sent


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def screen_text(app: DFlashApp) -> str:
    """What the terminal shows now, as text: every screen in the stack composited."""
    width, height = app.size
    console = Console(
        width=width, height=height, file=io.StringIO(), record=True, color_system=None
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text()


def run(coro):
    return asyncio.run(coro)


async def until(pilot, ok, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok() and time.monotonic() < deadline:
        await pilot.pause(0.1)


async def fed(pilot, app: DFlashApp, events) -> None:
    for e in events:
        app.feed(typed_event(e))
    app.redraw(force=True)
    await pilot.pause(0.3)
    # Drawn: the header from the store, the footer once it has laid out its keys (both can
    # take a few frames on a loaded machine).
    await until(pilot, lambda: "step 876" in screen_text(app) and "? help" in screen_text(app))
    # The panes below can take a few frames more (at 240x60 on a loaded machine the step log
    # was still empty): on until two frames 0.2 s apart are the same.
    seen, deadline = "", time.monotonic() + 15
    while (now := screen_text(app)) != seen and time.monotonic() < deadline:
        seen = now
        await pilot.pause(0.2)


def line_event(text: str) -> dict:
    return {
        "type": "line",
        "t": NOW,
        "run_id": RUN,
        "file": "train.log",
        "offset": 0,
        "end": 0,
        "text": text,
    }


def scripted() -> DFlashApp:
    return DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)


# -- the layout -------------------------------------------------------------------------


def test_at_80x24_the_essentials_are_on_screen():
    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, alert_state())
            screen = screen_text(app)
            header, footer = screen.splitlines()[0], screen.splitlines()[23]
            assert "crashed" in header and "step 876" in header and "14.2K tok/s" in header
            assert "● critical: run crashed in" in screen  # the top alert
            assert "q_pre[0]" in screen and "50/64" in screen and "q_hs[0]" in screen
            assert "step=876" in screen  # the step log
            assert "? help" in footer and "q quit" in footer

    run(go())


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_size_keeps_phase_step_alerts_queues_and_help(size):
    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            await fed(pilot, app, healthy())
            screen = screen_text(app)
            header = screen.splitlines()[0]
            assert "training" in header and "step 876" in header and "14.2K tok/s" in header
            assert "nothing wrong" in screen and "q_hs[0]" in screen and "step=876" in screen
            assert "? help" in screen.splitlines()[-1] and "q quit" in screen.splitlines()[-1]
            shown = plan(*size)
            assert "GPUs" in screen  # at every size: a row per device, or one line for all
            assert ("8× H200  util " in screen) == shown.gpus_compact
            assert ("│ Heartbeat" in screen) == shown.heartbeat
            assert app.query_one("#plots-box").display == shown.plots
            # A pane left out says so, with the rows it needs, on the log's bottom border.
            for name, rows in shown.hidden():
                assert f"{name} ({rows}+ rows)" in screen
            if size[0] >= 160:  # room for the whole run id
                assert RUN in header

    run(go())


def test_the_plan_gives_way_in_priority_order():
    small, medium, large = plan(80, 24), plan(120, 40), plan(240, 60)
    assert small.narrow and small.gpus_compact and not small.heartbeat
    assert not small.stages and not small.plots
    assert not medium.narrow and medium.heartbeat and medium.stages and not medium.plots
    assert large.heartbeat and large.stages and large.plots and large.plots_rows > 13
    assert [name for name, _ in small.hidden()] == ["Heartbeat", "Stages", "Plots"]
    assert small.hidden(ranks_run=True)[1] == ("Ranks", 30) and large.hidden() == []


def test_help_fits_80x24_names_esc_ctrl_p_scrolling_and_the_mouse_and_scrolls():
    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, healthy())
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.pause(0.2)
            top = screen_text(app)
            # Whole lines, the box's right edge on screen: nothing cut on the right.
            assert "K        kill (shift+k; type kill and Enter): SIGTERM its process" in top
            assert all(line.rstrip().endswith("█") for line in top.splitlines() if "█ " in line)
            await pilot.press("G")
            await pilot.pause(0.2)
            bottom = screen_text(app)
            for said in ("ctrl+p   the command palette", "Esc      close", "mouse    the wheel"):
                assert said in bottom
            assert "q        quit (on the dashboard): the remote run is left alone" in bottom
            assert "The run" not in bottom  # scrolled
            await pilot.press("g")
            await pilot.pause(0.2)
            assert "The run" in screen_text(app)
            await pilot.press("k", "j")  # scrolling here, never the kill dialog
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)

    run(go())


# -- the key fixes ----------------------------------------------------------------------


def test_in_the_stack_viewer_j_and_k_scroll_and_never_open_the_kill_dialog():
    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, healthy())
            dump = "\n".join(f'Thread "drafter-{i}" line {i}' for i in range(200))
            await app.push_screen(TextScreen("Stacks of pid 4242", dump))
            await pilot.pause(0.2)
            scroll = app.screen.query_one(VimScroll)
            assert scroll.has_focus
            await pilot.press("j", "j", "j")
            await pilot.pause(0.2)
            assert scroll.scroll_y == 3
            await pilot.press("k")
            await pilot.pause(0.2)
            assert scroll.scroll_y == 2
            assert isinstance(app.screen, TextScreen)  # not TypedConfirm("Kill run …?")
            await pilot.press("G")
            await pilot.pause(0.2)
            assert 'Thread "drafter-199" line 199' in screen_text(app)
            await pilot.press("g")
            await pilot.pause(0.2)
            assert scroll.scroll_y == 0
            await pilot.press("escape")
            assert not isinstance(app.screen, TextScreen)

    run(go())


def test_on_the_dashboard_k_scrolls_the_log_and_K_asks_to_kill():
    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, healthy())
            log = app.query_one(StepLog)
            assert log.has_focus  # the log is where the keys go first
            await until(pilot, lambda: log.scroll_y > 0)  # at its end, once laid out
            end = log.scroll_y
            assert end == log.max_scroll_y > 0
            await pilot.press("k", "k")
            await pilot.pause(0.2)
            assert log.scroll_y == end - 2 and not isinstance(app.screen, TypedConfirm)
            await pilot.press("g")
            await pilot.pause(0.2)
            assert log.scroll_y == 0
            app.feed(typed_event(line_event("step=878 while scrolled up")))
            await until(pilot, lambda: log.max_scroll_y > end)
            assert log.scroll_y == 0  # reading the top: the new line does not pull it down
            await pilot.press("G")
            await until(pilot, lambda: "step=878 while scrolled up" in screen_text(app))
            assert log.scroll_y == log.max_scroll_y == end + 1
            app.feed(typed_event(line_event("step=880 at the end")))
            await until(pilot, lambda: "step=880 at the end" in screen_text(app))  # followed
            # The dialog comes before the link is used; answered no, the link is never called
            # (these keys are about the dialog, not the kill: test_app.py kills for real).
            app.link = NO_LINK_CALLED
            await pilot.press("K")
            await until(pilot, lambda: isinstance(app.screen, TypedConfirm))
            assert isinstance(app.screen, TypedConfirm)
            assert f"Kill run {RUN}?" in screen_text(app)
            # y, n and Enter are text here: only the word `kill` and Enter would confirm.
            await pilot.press("y", "enter", "n", "enter", "k", "i", "l", "enter")
            await pilot.pause(0.2)
            assert isinstance(app.screen, TypedConfirm)
            assert "not confirmed: kil · type 'kill' and Enter" in screen_text(app)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, TypedConfirm))
            assert app.controls.busy is None  # cancelled: the link was never called

    run(go())


def test_c_refuses_at_once_while_the_run_is_alive_and_asks_once_it_is_not():
    async def go():
        app = scripted()
        async with app.run_test(size=(120, 40)) as pilot:
            await fed(pilot, app, healthy())  # its liveness: alive
            await pilot.press("c")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, TypedConfirm)
            said = [n.message for n in app._notifications]
            assert any(f"refused: run {RUN} is alive" in m for m in said), said
        app = scripted()
        async with app.run_test(size=(120, 40)) as pilot:
            await fed(pilot, app, alert_state())  # crashed: the process is gone
            app.link = NO_LINK_CALLED
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, TypedConfirm))
            assert "Delete the compile cache?" in screen_text(app)
            assert "type 'clear' and Enter to confirm" in screen_text(app)
            await pilot.press("y", "enter", "escape")
            await until(pilot, lambda: not isinstance(app.screen, TypedConfirm))
            assert app.controls.busy is None

    run(go())


def test_j_and_k_move_through_the_runs_list():
    async def go():
        app = scripted()
        async with app.run_test(size=(120, 40)) as pilot:
            await fed(pilot, app, healthy())
            await pilot.press("l")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen))
            await pilot.pause(0.2)
            table = app.screen.query_one("#runs")
            assert table.cursor_row == 0  # the followed run, newest first
            await pilot.press("j")
            assert table.cursor_row == 1
            await pilot.press("k")
            assert table.cursor_row == 0
            await pilot.press("escape")

    run(go())


# -- the step log ---------------------------------------------------------------------


def test_the_elapsed_minutes_read_as_time_not_as_leaked_ansi():
    async def go():
        app = scripted()
        async with app.run_test(size=(120, 40)) as pilot:
            await fed(pilot, app, [*healthy(), line_event("[0m] step=1 loss=11.7")])
            screen = screen_text(app)
            assert "+479m step=876" in screen and "[479m]" not in screen
            assert "0m step=1 loss=11.7" in screen and "[0m]" not in screen

    run(go())


def test_the_filter_is_a_case_insensitive_regex_over_the_dashboard_with_its_count():
    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, healthy())
            await pilot.press("slash", *"STEP=87[02]")
            await pilot.pause(0.3)
            open_ = screen_text(app)
            # Applied as typed; the dashboard stays in view; the bar takes the footer's line.
            assert "[filter /STEP=87[02]/ · 2 of 40 lines]" in open_
            assert "● critical" in open_ or "nothing wrong" in open_
            assert "q_hs[0]" in open_ and "/ STEP=87[02]" in open_.splitlines()[-1]
            shown = [ln for ln in open_.splitlines() if "step=87" in ln]
            assert len(shown) == 2 and "step=870" in shown[0] and "step=872" in shown[1]
            await pilot.press("enter")
            await pilot.pause(0.3)
            after = screen_text(app)
            assert "? help" in after.splitlines()[-1]  # the footer is back
            assert "2 of 40 lines" in after

            await pilot.press("slash", "ctrl+a", "ctrl+k", *"step=(8")
            await pilot.pause(0.3)
            bad = screen_text(app)
            assert "not a regex: missing ), unterminated subpattern at 5" in bad
            assert "40 of 40 lines" in bad  # the last good one, `step=`, still holds
            await pilot.press("escape")  # back to the filter before the bar opened
            await pilot.pause(0.3)
            assert app.query_one(StepLog).pattern == "STEP=87[02]"
            assert app.query_one(StepLog).has_focus

    run(go())


def test_long_lines_scroll_sideways_or_wrap():
    where = 'File "/workspace/dflash/trainer/runtime/pipeline.py", '
    traceback = "  " + where + "x" * 60 + ", line 314, in _drafter_loop"

    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, [*healthy(), line_event(traceback)])
            log = app.query_one(StepLog)
            assert "line 314" not in screen_text(app)  # past the pane's right edge
            assert log.max_scroll_x > 0  # but there, not cut off
            for _ in range(80):
                await pilot.press("right")
            await pilot.pause(0.2)
            assert "line 314, in _drafter_loop" in screen_text(app)
            await pilot.press("w")
            await until(pilot, lambda: "[wrap]" in screen_text(app))
            wrapped = screen_text(app)
            assert "[wrap]" in wrapped and "line 314, in" in wrapped  # folded at a space
            assert log.max_scroll_x == 0

    run(go())


# -- panes ----------------------------------------------------------------------------


def test_tab_moves_between_panes_and_z_zooms_the_focused_one():
    async def go():
        app = scripted()
        async with app.run_test(size=(160, 48)) as pilot:
            await fed(pilot, app, alert_state())
            assert app.query_one(StepLog).has_focus
            await pilot.press("tab")  # the log, then the side column: queues, then alerts
            await pilot.press("tab")
            await pilot.pause(0.1)
            alerts = app.query_one("#alerts-box", Pane)
            assert alerts.has_focus
            # Focus visible: the focused pane's border is the theme's accent, no other's is.
            accent = Color.parse(app.current_theme.accent or "")
            borders = {b.id: b.styles.border_top[1] for b in app.query(".box") if b.display}
            focused = borders.pop("alerts-box")
            assert all(abs(a - b) <= 2 for a, b in zip(focused.rgb, accent.rgb, strict=True))
            assert borders and focused not in borders.values()
            await pilot.press("z")
            await pilot.pause(0.3)
            assert app.screen.maximized is alerts
            zoomed = screen_text(app)
            assert "● critical: run crashed in drafter-1" in zoomed
            assert "Queues" not in zoomed and "step=876" not in zoomed
            await pilot.press("z")
            await pilot.pause(0.3)
            assert app.screen.maximized is None and "Queues" in screen_text(app)
            await pilot.press("shift+tab", "shift+tab")
            await pilot.press("z")
            await pilot.pause(0.3)
            assert app.screen.maximized is app.query_one("#log-box")
            assert "Alerts" not in screen_text(app)
            await pilot.press("escape")
            await pilot.pause(0.3)
            assert app.screen.maximized is None

    run(go())


# -- $PAGER ---------------------------------------------------------------------------


def test_the_pager_gets_the_log_sanitised_and_plain_less_by_default(tmp_path):
    path = pager.write_log(["step=1 \x1b[2J\x1b]0;owned\x07 ok", "two"], "run/../x")
    try:
        text = path.read_text()
        assert "\x1b" not in text and "\x07" not in text
        assert text.splitlines()[1] == "two" and "\\x1b[2J" in text
        assert path.stat().st_mode & 0o077 == 0  # this user's only
        assert "/" not in path.name.removeprefix("dflash-")
    finally:
        path.unlink()
    assert pager.command({}) == ["less"]
    assert pager.command({"PAGER": "most -s"}) == ["most", "-s"]
    with pytest.raises(pager.PagerError, match="PAGER 'less \"-R': No closing quotation"):
        pager.command({"PAGER": 'less "-R'})


def test_in_a_viewer_slash_searches_n_and_N_move_and_the_dashboards_keys_do_nothing():
    """Seen in issue 32: `/drafter` typed in the stack viewer switched the theme and took
    another dump. Now `/` searches as less does, and r d t c K l Enter act on nothing."""

    async def go():
        app = scripted()
        async with app.run_test(size=(80, 24)) as pilot:
            await fed(pilot, app, healthy())
            app.link = NO_LINK_CALLED  # a key that reached a control would use it
            theme = app.theme
            long = "x" * 150  # wraps: the row of a line below it is counted, not assumed
            dump = "\n".join(
                f'Thread "drafter-{i}" line {i}' + (long if i == 5 else "") for i in range(200)
            )
            await app.push_screen(TextScreen("Stacks of pid 4242", dump))
            await pilot.pause(0.2)
            await pilot.press("r", "d", "t", "c", "K", "l", "enter", "i", "p", "T", "v")
            await pilot.pause(0.2)
            assert isinstance(app.screen, TextScreen) and len(app.screen_stack) == 2
            assert app.theme == theme and app.controls.busy is None
            await pilot.press("slash", *"DRAFTER-1[0-9]\\b", "enter")
            await pilot.pause(0.3)
            keys_line = screen_text(app).splitlines()[-1]
            assert "/DRAFTER-1[0-9]\\b: match 1 of 10, line 11" in keys_line
            assert 'Thread "drafter-10" line 10' in screen_text(app)
            assert 'Thread "drafter-1" line 1\n' not in screen_text(app)  # scrolled to it
            await pilot.press("n", "n")
            await pilot.pause(0.3)
            assert "match 3 of 10, line 13" in screen_text(app).splitlines()[-1]
            await pilot.press("N", "N", "N")  # round the top: the last match
            await pilot.pause(0.3)
            assert "match 10 of 10, line 20" in screen_text(app).splitlines()[-1]
            assert 'Thread "drafter-19" line 19' in screen_text(app)
            await pilot.press("slash", "ctrl+a", "ctrl+k", *"(", "enter")
            await pilot.pause(0.2)
            assert "not a regex: missing )" in screen_text(app)
            await pilot.press("escape")  # the search line, not the viewer
            await pilot.pause(0.2)
            assert isinstance(app.screen, TextScreen)
            await pilot.press("q")
            await pilot.pause(0.2)
            assert len(app.screen_stack) == 1 and app.theme == theme

    run(go())


def test_v_opens_the_log_in_a_viewer_with_search():
    async def go():
        app = scripted()
        async with app.run_test(size=(120, 40)) as pilot:
            await fed(pilot, app, healthy())
            await pilot.press("v")
            await until(pilot, lambda: isinstance(app.screen, TextScreen))
            await pilot.pause(0.2)
            assert "Step log of" in screen_text(app).splitlines()[0]
            await pilot.press("slash", *"step=87[02]", "enter")
            await pilot.pause(0.3)
            assert ": match 1 of 2, line" in screen_text(app).splitlines()[-1]
            await pilot.press("escape")
            await until(pilot, lambda: len(app.screen_stack) == 1)

    run(go())
