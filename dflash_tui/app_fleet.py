"""`dflash-tui fleet`: the fleet screen over the dashboard, one connection per target.

The fleet app is the dashboard app (DFlashApp) with the fleet screen pushed over it. Enter
on a target points the dashboard at that target's own store and link (fleet_links.py) and
pops the fleet screen: the dashboard, its keys and its control commands are the ones
`dflash-tui TARGET` has, over the connection the fleet already holds. Esc or q there pushes
the fleet back; every link stays up meanwhile, so both views stay live.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.binding import Binding

from dflash_tui import themes
from dflash_tui.app import DFlashApp
from dflash_tui.fleet_links import Fleet
from dflash_tui.targets import Target
from dflash_tui.widgets.fleet import FleetScreen
from dflash_tui.widgets.steplog import StepLog

# The dashboard's keys that act on "the" target: none is meant while the fleet is shown.
DASHBOARD_ACTIONS = frozenset(
    {"restart", "kill", "dump_stacks", "clear_cache", "runs", "filter", "follow", "fleet"}
)


class FleetApp(DFlashApp):
    BINDINGS = [Binding("escape,q", "fleet", "fleet")]  # q: back to the fleet, not quit

    def __init__(
        self,
        fleet: Fleet,
        theme_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(fleet.members[0].target, theme_name, connect=False, clock=clock)
        self.fleet = fleet
        self.fleet_screen = FleetScreen(lambda: fleet.rows(clock()), self.open_target)

    def on_mount(self) -> None:
        # DFlashApp.on_mount runs too (Textual calls each class's handler): its redraw timer
        # draws whichever target is open; with connect=False it starts no link of its own.
        self.fleet.start()
        self.install_screen(self.fleet_screen, name="fleet")
        self.push_screen("fleet")

    async def on_unmount(self) -> None:
        await self.fleet.close()  # the remote runs are left alone

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in DASHBOARD_ACTIONS and self.screen is self.fleet_screen:
            return False
        return super().check_action(action, parameters)

    def open_target(self, name: str) -> None:
        """The dashboard of `name`, over its link and store."""
        member = self.fleet.member(name)
        self.show_store(member.target, member.store, member.link, member.config)
        self.run_worker(self._show_dashboard(), group="fleet")

    async def _show_dashboard(self) -> None:
        await self.pop_screen()
        self.query_one(StepLog).rebuild(self.store)  # the log of this target, not the last
        self.redraw(force=True)

    def action_fleet(self) -> None:
        if len(self.screen_stack) == 1:  # from the dashboard itself, not over its dialogs
            self.push_screen("fleet")


async def run_fleet_app(targets: list[Target], theme: str | None = None) -> int:
    if theme and theme not in themes.available_themes():
        known = ", ".join(sorted(themes.available_themes()))
        raise themes.ThemeError(f"--theme {theme!r}: no such theme (known: {known})")
    app: Any = FleetApp(Fleet(targets), theme_name=theme)
    await app.run_async()
    return 0
