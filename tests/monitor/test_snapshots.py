"""SVG snapshots of the main screen in every theme, and of an alert state from the seeds.

Update after an intended change with: .venv/bin/python -m pytest tests/monitor/test_snapshots.py
--snapshot-update, then look at the SVGs before committing them.
"""

from __future__ import annotations

import pytest
from app_scenarios import NOW, RUN, alert_state, healthy
from monitor_helpers import typed_event

from dflash_tui.app import DFlashApp
from dflash_tui.restart_offer import ALIVE, Offer
from dflash_tui.targets import Target
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.restart_dialog import RestartDialog
from dflash_tui.widgets.screens import (
    HelpScreen,
    RunsScreen,
    TextScreen,
)
from dflash_tui.widgets.thread_table import SIGNAL_WHAT, ThreadsScreen
from trainer.contract.protocol import PROCESS_SIGNALS

SIZE = (160, 48)
KILL_QUESTION = f"Kill run {RUN}? SIGTERM, then SIGKILL after 30 s."
# The layout's sizes (dflash_tui/widgets/layout.py): the essentials at 80x24, everything at
# 240x60. What each shows is asserted as text in test_layout_keys.py.
SIZES = [(80, 24), (120, 40), (160, 48), (240, 60)]
TARGET = Target(name="gpu-box", kind="ssh", host="gpu-box")


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def app_with(events, theme):
    app = DFlashApp(TARGET, theme_name=theme, connect=False, clock=lambda: NOW)

    async def feed(pilot):
        for e in events:
            app.feed(typed_event(e))
        app.redraw(force=True)
        await pilot.pause(0.3)

    return app, feed


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_main_screen(snap_compare, theme, size):
    app, feed = app_with(healthy(), theme)
    assert snap_compare(app, terminal_size=size, run_before=feed)


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_alert_state_at_80x24(snap_compare, theme):
    app, feed = app_with(alert_state(), theme)
    assert snap_compare(app, terminal_size=(80, 24), run_before=feed)


def test_alert_state_from_the_seed_scenarios(snap_compare):
    app, feed = app_with(alert_state(), "dark")
    assert snap_compare(app, terminal_size=SIZE, run_before=feed)


# -- every screen at the sizes issue 32 names ----------------------------------------------
# One theme: the themes' colours are the snapshots above; these are about what fits. Each
# opens its screen over the healthy dashboard (tests/monitor/test_sizes.py asserts the same
# layouts as text). 24 cases: ~45 s on a loaded 2-core machine (27 took 46 s), ~2 s each.
ISSUE_SIZES = [(80, 24), (120, 40), (160, 48)]
RUN_QUESTION = f"Restart run {RUN}? It is alive: it is killed first, then launched again."


def lost_link() -> list[dict]:
    """The healthy run, then the link drops: the note once, the panes' last picture."""
    return [
        *healthy(),
        {
            "type": "link",
            "t": NOW - 2,
            "state": "reconnecting",
            "detail": "gpu-box:22 unreachable: [Errno 111] Connect call failed",
            "target": "gpu-box",
            "retry_in": 4.0,
        },
    ]


def open_screen(app: DFlashApp, name: str) -> None:
    stack = "\n".join(
        f'Thread "drafter-{i}" (most recent call first):\n  line {i}' for i in range(40)
    )
    screens = {
        "help": HelpScreen,
        "threads": ThreadsScreen,
        "runs": lambda: RunsScreen(app.store.runs, app.store.run_id),
        "stacks": lambda: TextScreen("Stacks of pid 4242", stack),
        "kill": lambda: TypedConfirm(
            f"Kill run {RUN}? SIGTERM, then SIGKILL after 30 s.", ("kill",)
        ),
        "restart": lambda: RestartDialog(
            Offer(ALIVE, RUN, RUN_QUESTION, "Resume from step 800 (checkpoints/step-00000800.pt)")
        ),
        "signal": lambda: signal_dialog(f"Signal pid 4242 (python3), the run's trainer ({RUN})?"),
    }
    if name in screens:
        app.push_screen(screens[name]())


# The dashboard itself is test_main_screen's, at these sizes and more.
SCREENS = ["link-lost", "help", "threads", "runs", "stacks", "kill", "restart", "signal"]


@pytest.mark.parametrize("size", ISSUE_SIZES, ids=[f"{w}x{h}" for w, h in ISSUE_SIZES])
@pytest.mark.parametrize("screen", SCREENS)
def test_each_screen_at_each_size(snap_compare, screen, size):
    app, feed = app_with(lost_link() if screen == "link-lost" else healthy(), "dark")

    async def before(pilot):
        await feed(pilot)
        open_screen(app, screen)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


def signal_dialog(question: str) -> TypedConfirm:
    """The threads view's per-process signal, as it opens it (widgets/thread_table.py)."""
    return TypedConfirm(question, PROCESS_SIGNALS, SIGNAL_WHAT)
