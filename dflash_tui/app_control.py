"""The dashboard's run controls: kill, restart, dump stacks, clear the compile cache, the runs
chooser (follow one, compare several) and run info, each with its dialog.

One command at a time: `start` refuses a second while one is in flight (`busy` names it), in
a replay, without a link, or at once when the run's state rules it out (offline.py's
`control_refusal`), before any dialog. Every command goes through control.py, the CLI's path
too. Restart's dialog offers what the run's state allows (restart_offer.py). The thread
table's actions (widgets/thread_table.py) start theirs here as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from dflash_tui import compare, control, run_info
from dflash_tui.control import ControlError
from dflash_tui.link.link import LinkError
from dflash_tui.offline import control_refusal
from dflash_tui.restart_offer import (
    CONTINUE,
    DIED_BEFORE_START,
    Choice,
    Offer,
    launch_record,
    offer,
)
from dflash_tui.widgets.compare import CompareScreen
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.replay import REFUSED
from dflash_tui.widgets.restart_dialog import RestartDialog
from dflash_tui.widgets.screens import RunsScreen, TextScreen
from trainer.contract.protocol import Progress
from trainer.contract.records import LAUNCH_CONFIG


class RunControl:
    def __init__(self, app: Any) -> None:
        """`app`: the DFlashApp (its store and link, which the fleet swaps per target);
        typed loosely, as this module may not import the app that imports it."""
        self.app = app
        self.busy: str | None = None  # the control command in flight, if any
        # The newest stack dump taken (d): the threads view shows a thread's part of it.
        self.last_stacks: control.Stacks | None = None
        self.last_stacks_at = 0.0  # the app's clock when it came

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run the command `name` (`run`, its dialog included) unless refused, said in a toast."""
        app = self.app
        if getattr(app.screen, "replaying", False):
            app.notify(REFUSED, severity="warning")  # the palette's way to the actions
            return
        if self.busy is not None:
            app.notify(f"{self.busy} is still running: wait for it", severity="warning")
            return
        if app.link is None:
            app.notify("not connected", severity="error")
            return
        refusal = control_refusal(app.store, name)  # at once, before any dialog
        if refusal is not None:
            app.notify(refusal, severity="warning")
            return
        self.busy = name
        app.run_worker(self.run_guarded(name, run), group="control", exclusive=False)

    async def run_guarded(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        except (LinkError, ControlError) as e:
            self.app.notify(f"{name}: {e}", severity="error", timeout=12)
        finally:
            self.busy = None

    def progress(self, event: Progress) -> None:
        self.app.notify(event.message, title=self.busy or "", timeout=6)

    async def confirm(self, question: str, word: str) -> bool:
        """Whether the operator typed `word` and Enter (widgets/dialogs.py): never a stray key."""
        screen: Any = TypedConfirm(question, (word,))
        return await self.app.push_screen_wait(screen) == word

    def kill(self) -> None:
        app = self.app

        async def run() -> None:
            grace = control.kill_command().timeout_s
            if not await self.confirm(
                f"Kill run {app.store.alive_run or '?'}? "
                f"(SIGTERM its process group, SIGKILL after {grace:.0f} s)",
                "kill",
            ):
                return
            k = await control.kill(app.link, on_progress=self.progress)
            drain = f", GPU memory released in {k.drain_s:.1f}s" if k.drain_s is not None else ""
            app.notify(
                f"{k.run_id} {k.describe()}; {k.stop_s:.1f}s{drain}", title="kill", timeout=10
            )

        self.start("kill", run)

    async def restart_offer(self) -> Offer:
        """What restart offers in the followed run's state (restart_offer.py), with the files
        that state needs read through the agent: a run that died before start, its
        launch.json (the overrides to edit) and launch-config.toml (what they are checked
        against); a finished one, its config.json (the lr)."""
        app = self.app
        first = offer(app.store, None)
        if first.state not in (DIED_BEFORE_START, CONTINUE) or app.store.run_id is None:
            return first
        name = "launch.json" if first.state == DIED_BEFORE_START else "config.json"
        try:
            text: str | None = (await control.read_file(app.link, name, app.store.run_id)).text
        except (LinkError, ControlError):
            text = None  # said in the dialog (no overrides to edit, the lr in words only)
        if first.state == DIED_BEFORE_START:
            try:  # the config the edited overrides are checked against before the relaunch
                config = (await control.read_file(app.link, LAUNCH_CONFIG, app.store.run_id)).text
            except (LinkError, ControlError):
                config = None  # then each is checked as KEY=VALUE only
            return dataclasses.replace(offer(app.store, launch_record(text)), config_toml=config)
        return offer(app.store, None, text)

    def restart(self) -> None:
        app = self.app

        async def run() -> None:
            run_id = app.store.run_id
            screen: Any = RestartDialog(await self.restart_offer())
            choice: Choice | None = await app.push_screen_wait(screen)
            if choice is None:
                return
            r = await control.restart(
                app.link,
                run_id,
                on_progress=self.progress,
                fresh=choice.fresh,
                overrides=choice.overrides,
                more_steps=choice.more_steps,
                new_schedule=choice.new_schedule,
            )
            if r.killed is not None:
                app.notify(f"{r.killed.run_id} {r.killed.describe()}", title="kill", timeout=10)
            app.notify(r.describe(), title="restart", timeout=10)

        self.start("restart", run)

    def dump_stacks(self) -> None:
        app = self.app

        async def run() -> None:
            st = self.last_stacks = await control.dump_stacks(app.link)
            self.last_stacks_at = app.clock()
            text = st.text + (("\n# py-spy dump --native\n" + st.pyspy) if st.pyspy else "")
            await app.push_screen(TextScreen(f"Stacks of pid {st.pid} — {st.path}", text))

        self.start("dump stacks", run)

    def clear_cache(self) -> None:
        app = self.app
        if app.store.process_alive():  # refused before asking: the agent would refuse too
            app.notify(
                f"clear cache: refused: run {app.store.alive_run or app.store.run_id} is alive "
                "(the compile cache is in use); kill it first (K)",
                severity="warning",
            )
            return

        async def run() -> None:
            if not await self.confirm(
                "Delete the compile cache? The next start recompiles.", "clear"
            ):
                return
            c = await control.clear_cache(app.link)
            app.notify(
                f"removed {c.path} ({c.bytes / 1e6:.1f} MB)"
                if c.existed
                else f"no compile cache at {c.path}",
                title="clear cache",
            )

        self.start("clear cache", run)

    def runs(self) -> None:
        """The runs chooser: Enter follows a run, marked runs are compared."""
        app = self.app

        def chosen(choice: str | list[str] | None) -> None:
            if isinstance(choice, list):
                self.start("compare", lambda: self.compare(choice))
            elif choice and app.link is not None:
                app.link.follow_target = choice
                self.start("follow", lambda: self.follow(choice))

        app.push_screen(RunsScreen(app.store.runs, app.store.run_id), chosen)

    async def follow(self, run_id: str) -> None:
        await control.follow(self.app.link, run_id)

    async def compare(self, run_ids: list[str]) -> None:
        runs = await compare.fetch_runs(self.app.link, self.app.store.runs, run_ids)
        await self.app.push_screen(CompareScreen(runs))

    def run_info(self) -> None:
        app = self.app
        run_id = app.store.run_id
        if run_id is None:
            app.notify("no run followed yet", severity="warning")
            return

        async def run() -> None:
            lines = await run_info.fetch(app.link, app.store, run_id)
            await app.push_screen(TextScreen(f"Run {run_id}", "\n".join(lines)))

        self.start("run info", run)
