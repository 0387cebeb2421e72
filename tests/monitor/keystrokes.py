"""Random keystrokes into the real app's viewers and dialogs (issue 32, keys by mode), for
tests/monitor/test_keys_by_mode.py and bench/keystroke_bench.py.

`LiveApp` is the real DFlashApp under Pilot, on a loop thread of its own (so a hypothesis
test, which is sync, can drive it), attached through a real local agent to a real tiny run.
Every command its link writes to the agent is recorded at `Link._write`: the one place a
request leaves the app. What is under test is the app's key routing, not the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import string
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from monitor_helpers import NO_WANDB, TINY, Remote
from textual import app as textual_app
from textual.binding import Binding

from dflash_tui import compare, control, replay_source, run_info
from dflash_tui.app import DFlashApp
from dflash_tui.diagnosis import docs
from dflash_tui.targets import Target
from dflash_tui.widgets import keys
from dflash_tui.widgets.alerts import ExplainScreen
from dflash_tui.widgets.compare import CompareScreen
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.replay import ReplayScreen
from dflash_tui.widgets.screens import HelpScreen, TextScreen
from dflash_tui.widgets.thread_table import ThreadsScreen
from trainer.contract.protocol import Kill, Launch

NAMED = [
    "enter", "escape", "tab", "shift+tab", "backspace", "delete", "up", "down", "left",
    "right", "home", "end", "pageup", "pagedown",
]  # fmt: skip
# Every printable character and the named keys, Enter weighted up (it confirms and opens).
ALPHABET = [*string.printable[:95], *NAMED, "enter", "enter", "enter", "enter"]
# Drawn as often as all the rest: the dashboard's own keys (what a viewer must not pass on)
# and the letters of the dialogs' words (so that near-misses like "kil" + Enter come up).
APP_KEYS = sorted(
    {k for b in keys.DASHBOARD if isinstance(b, Binding) for k in b.key.split(",")} - {"q"}
)  # q closes a viewer: drawn from ALPHABET only, or most examples would end at once
WORD_KEYS = sorted(set("killclearSIGTERMSIGKILLSIGUSR2sigtermsigkillsigusr2"))
KEYS = st.lists(
    st.one_of(st.sampled_from(ALPHABET), st.sampled_from([*APP_KEYS, *WORD_KEYS, "enter"])),
    min_size=1,
    max_size=30,
)

VIEWERS = ("help", "log", "threads", "stacks", "run info", "replay", "compare", "explain")
DIALOGS = ("kill", "signal")  # while the run is alive; "clear" once it is not
PING = "ping"  # the link's own keep-alive, not a request of the app's


def start_run(remote_dir: Path) -> tuple[Target, str]:
    """The trainer deployed under `remote_dir`, a tiny run launched and training."""
    from test_control_local import deploy

    target = Target(name="local", kind="local", remote_dir=str(remote_dir), python=sys.executable)
    r = Remote(target)
    try:
        deploy(r)
        run_id = r.request(
            Launch(
                config_toml=TINY.read_text(),
                name="tiny-cpu",
                overrides=[NO_WANDB, "train.max_steps=100000"],
            )
        )["run_id"]
        r.wait(lambda s: s.heartbeat and s.heartbeat.phase == "training", 120, "training")
    finally:
        r.close()
    return target, run_id


def stop_run(target: Target) -> None:
    r = Remote(target)
    try:
        with contextlib.suppress(Exception):
            r.request(Kill(timeout_s=10, drain_timeout_s=5), timeout=40)
    finally:
        r.close()


class LiveApp:
    def __init__(
        self, target: Target, size: tuple[int, int] = (120, 40), settled_keys: bool = False
    ) -> None:
        """`settled_keys`: after each key, wait until the app and the screen on top have
        handled what was queued (three rounds: a key hops from the app to the focused
        widget and back up to the bindings) instead of Pilot's wait for the whole process
        to look idle, which sleeps 20 ms twice a key and, beside a live link, often up to
        1 s. Keys then come faster than a typist's: a key can reach a screen before the one
        before it has finished pushing or closing another, which can only add requests to
        the count, never hide one."""
        self.app = DFlashApp(target, theme_name="dark")
        self.size = size
        self.settled_keys = settled_keys
        # A request a key started has been written by then (a late one is still counted:
        # `late_requests`).
        self.after_keys = 0.02 if settled_keys else 0.1
        self.sent: list[str] = []  # every command the link wrote, but pings
        self.window_closed_at = 0  # len(self.sent) when the last example's keys were done
        self.late_requests: list[str] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._work: asyncio.Queue[tuple[Awaitable[Any], Future[Any]]]
        self._held = asyncio.run_coroutine_threadsafe(self._hold(), self.loop)
        if not self._ready.wait(60):
            raise AssertionError("the app did not start")
        self.call(self._attached())
        self.cache: dict[str, Any] = self.call(self._fetch_views())

    # -- the app on its thread ------------------------------------------------------------
    async def _hold(self) -> None:
        """The app's test session; every coroutine `call` is handed runs in this task, where
        Textual's context (the active app) is set, as in an `async with app.run_test()`."""
        self._stop = asyncio.Event()
        self._work: asyncio.Queue[tuple[Awaitable[Any], Future[Any]]] = asyncio.Queue()
        async with self.app.run_test(size=self.size) as pilot:
            self.pilot = pilot
            pilots_wait = textual_app.wait_for_idle
            if self.settled_keys:
                textual_app.wait_for_idle = self._settled  # what Pilot's press waits with
            try:
                self._ready.set()
                await self._serve()
            finally:
                textual_app.wait_for_idle = pilots_wait

    async def _serve(self) -> None:
        while True:
            get = asyncio.ensure_future(self._work.get())
            assert self._stop is not None
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                break
            stop.cancel()
            coro, done = get.result()
            try:
                done.set_result(await coro)
            except BaseException as e:  # handed back to the caller's thread
                done.set_exception(e)

    async def _settled(self, *_: Any, **__: Any) -> None:
        for _ in range(3):
            await self.pilot._wait_for_screen()

    def call(self, coro: Awaitable[Any], timeout: float = 120) -> Any:
        done: Future[Any] = Future()
        self.loop.call_soon_threadsafe(self._work.put_nowait, (coro, done))
        return done.result(timeout)

    def close(self) -> None:
        try:
            if self._stop is not None:
                self.loop.call_soon_threadsafe(self._stop.set)
            self._held.result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    async def until(self, ok: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = ok()
            if value:
                return value
            await self.pilot.pause(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    async def _attached(self) -> None:
        app = self.app
        await self.until(lambda: app.link is not None, "the link")
        write = app.link._write

        async def counted(agent: Any, cmd: Any) -> None:
            if cmd.cmd != PING:
                self.sent.append(cmd.cmd)
            await write(agent, cmd)

        app.link._write = counted  # the boundary: every request leaves the app here
        await self.until(
            lambda: app.store.heartbeat and app.store.heartbeat.phase == "training"
            and app.store.procs and app.store.procs.pgid,
            "the run training, its processes listed",
        )  # fmt: skip

    async def _fetch_views(self) -> dict[str, Any]:
        """What the viewers that fetch show, fetched once through the real link (each
        example pushes the viewer anew with it, as the app does after its fetch)."""
        app = self.app
        run_id = app.store.run_id
        stacks = await control.dump_stacks(app.link)
        app.controls.last_stacks, app.controls.last_stacks_at = stacks, app.clock()
        await self.until(lambda: app.store.runs, "the runs list")
        fetched = {
            "stacks": stacks.text,
            "run info": "\n".join(await run_info.fetch(app.link, app.store, run_id)),
            "replay": await replay_source.fetch(app.link, app.store, run_id),
            "compare": await compare.fetch_runs(app.link, app.store.runs, [run_id, run_id]),
        }
        self.window_closed_at = len(self.sent)
        return fetched

    def _late(self) -> None:
        """Requests written after the last example's window closed (its keys' pause over)
        and before this example opens its screen: a key's late request, which the
        per-example counts would miss. Nothing else writes one in that gap: closing a
        screen or answering a dialog None sends nothing."""
        self.late_requests += self.sent[self.window_closed_at :]

    # -- one example -------------------------------------------------------------------------
    async def to_dashboard(self) -> None:
        """Every screen over the dashboard closed, a dialog answered None (its command then
        ends without sending anything)."""
        app = self.app
        while len(app.screen_stack) > 1:
            await app.screen.dismiss(None)
            await self.pilot.pause(0.02)
        await self.until(lambda: app.controls.busy is None, "the dialog's command to end")

    async def open_viewer(self, name: str) -> None:
        app, pilot = self.app, self.pilot
        if name in ("help", "log", "threads"):  # the dashboard's own keys
            await pilot.press({"help": "question_mark", "log": "v", "threads": "T"}[name])
        elif name in ("stacks", "run info"):
            app.push_screen(TextScreen(name, self.cache[name]))
        elif name == "replay":
            app.push_screen(ReplayScreen(app.store.run_id, recording=self.cache["replay"]))
        elif name == "compare":
            app.push_screen(CompareScreen(self.cache["compare"]))
        elif name == "explain":
            app.push_screen(ExplainScreen(sorted(docs.codes())[:3]))
        kinds = {"help": HelpScreen, "log": TextScreen, "threads": ThreadsScreen}
        kind = kinds.get(name, type(None))
        await self.until(
            lambda: (
                len(app.screen_stack) == 2 and (kind is type(None) or isinstance(app.screen, kind))
            ),
            f"the {name} viewer",
        )
        await pilot.pause(0.05)

    async def open_dialog(self, name: str) -> tuple[str, ...]:
        """The dialog, through the app's own path; the words that would confirm it."""
        app = self.app
        if name == "kill":
            app.action_kill()
        elif name == "clear":
            app.action_clear_cache()
        elif name == "signal":
            threads = ThreadsScreen()
            await app.push_screen(threads)
            procs = app.store.procs
            trainer = next(p for p in procs.procs if p.pid == procs.leader)
            threads.offer_signal(trainer, leader=True)
        await self.until(lambda: isinstance(app.screen, TypedConfirm), f"the {name} dialog")
        return app.screen.words

    async def viewer_example(self, name: str, keys: list[str]) -> list[str]:
        """The requests that left the app while `keys` went to the viewer `name` (until
        they closed it: after that they would be the dashboard's)."""
        await self.to_dashboard()
        self._late()
        await self.open_viewer(name)
        before = len(self.sent)
        for key in keys:
            if len(self.app.screen_stack) == 1:
                break
            await self.pilot.press(key)
        await self.pilot.pause(self.after_keys)  # a request a key started is written by now
        sent = self.sent[before:]
        self.window_closed_at = len(self.sent)
        await self.to_dashboard()
        return sent

    async def dialog_example(self, name: str, keys: list[str]) -> tuple[list[str], bool]:
        """The requests that left the app while `keys` went to the dialog `name`, and
        whether they reached an Enter on the very word that confirms (then cut there:
        that is a confirmation, not a stray key)."""
        await self.to_dashboard()
        self._late()
        words = {w.lower() for w in await self.open_dialog(name)}
        dialog = self.app.screen
        before = len(self.sent)
        typed_word = False
        for key in keys:
            if self.app.screen is not dialog:
                break  # cancelled (Esc)
            value = dialog.query_one("#word").value.strip().lower()
            if key == "enter" and value in words:
                typed_word = True
                break
            await self.pilot.press(key)
        await self.pilot.pause(self.after_keys)
        sent = self.sent[before:]
        self.window_closed_at = len(self.sent)
        await self.to_dashboard()
        return sent, typed_word
