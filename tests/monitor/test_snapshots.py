"""SVG snapshots of the main screen in every theme, and of an alert state from the seeds.

Update after an intended change with: .venv/bin/python -m pytest tests/monitor/test_snapshots.py
--snapshot-update, then look at the SVGs before committing them.
"""

from __future__ import annotations

import pytest
from app_scenarios import NOW, alert_state, healthy
from monitor_helpers import typed_event

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target

SIZE = (160, 48)
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
