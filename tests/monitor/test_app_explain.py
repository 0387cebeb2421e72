"""`x` on the focused alerts pane: the registry's entry for each alert's code (the text of
`dflash-tui explain CODE`), ← → between them, escape back. The TUI under Pilot."""

from __future__ import annotations

import asyncio

from app_scenarios import alert_state, healthy
from monitor_helpers import typed_event
from test_app import SIZE, plain, scripted_app, until

from dflash_tui.diagnosis import docs
from dflash_tui.widgets.alerts import AlertsBox, AlertsPane, ExplainScreen


def test_x_on_the_alerts_explains_each_alerts_code() -> None:
    async def go() -> None:
        app = scripted_app()
        async with app.run_test(size=SIZE) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            await until(pilot, lambda: "nothing wrong" in plain(app.query_one(AlertsPane)))
            app.query_one(AlertsBox).focus()
            await pilot.press("x")  # no alert: said, no screen
            assert not isinstance(app.screen, ExplainScreen)

            for e in alert_state()[len(healthy()) :]:
                app.feed(typed_event(e))
            await until(pilot, lambda: "critical" in plain(app.query_one(AlertsPane)))
            shown = list(dict.fromkeys(f.code for f in app.query_one(AlertsPane).findings))
            assert shown == ["crashed"]
            app.query_one(AlertsBox).focus()
            await pilot.press("x")
            screen = app.screen
            assert isinstance(screen, ExplainScreen)
            text = plain(screen.query_one("#explain"), width=100)
            assert text.startswith("crashed   alert 1 of 1 · j/k scroll · esc close")
            for line in docs.explain("crashed").splitlines()[:3]:
                assert line in text
            await pilot.press("escape")
            assert not isinstance(app.screen, ExplainScreen)

            # Several alerts: ← → go round them.
            app.push_screen(ExplainScreen(["gil_pressure", "slow_link", "rule_error"]))
            await pilot.pause(0.1)
            screen = app.screen
            await pilot.press("right")
            text = plain(screen.query_one("#explain"), width=100)
            assert text.startswith("slow_link   alert 2 of 3 · ← → the others")
            assert "rank_wait_frac = 0.3" in text
            await pilot.press("left", "left")
            text = plain(screen.query_one("#explain"), width=100)
            assert text.startswith("rule_error   alert 3 of 3")
            await pilot.press("x")
            assert not isinstance(app.screen, ExplainScreen)

    asyncio.run(go())
