"""The footer's key bar, rebuilt at every screen change, leaves nothing behind (Textual keeps
the removed keys' watchers, and the keys with them, until `compact` changes: widgets/footer.py).
The real app under Pilot, viewers opened and closed as an operator does."""

from __future__ import annotations

import asyncio
import gc
import sys

from textual.widgets._footer import FooterKey

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.screens import HelpScreen, TextScreen
from dflash_tui.widgets.thread_table import ThreadsScreen


def live_keys() -> int:
    gc.collect()
    # type(), not isinstance: isinstance reads __class__, which some of torch's module
    # proxies answer with a deprecation warning.
    return sum(type(o) is FooterKey for o in gc.get_objects())


def test_opening_and_closing_viewers_leaves_no_footer_keys_alive(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    target = Target(
        name="local", kind="local", remote_dir=str(tmp_path / "r"), python=sys.executable
    )
    app = DFlashApp(target, theme_name="dark")

    async def go() -> list[int]:
        counts = []
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            for _round in range(2):
                for make in (
                    lambda: TextScreen("stacks", "a line\n" * 50),
                    HelpScreen,
                    ThreadsScreen,
                    lambda: TypedConfirm("Kill?", ("kill",)),
                ):
                    for _ in range(3):
                        await app.push_screen(make())
                        await pilot.pause(0.02)
                        await pilot.press("j", "k")
                        app.pop_screen()
                        await pilot.pause(0.02)
                counts.append(live_keys())
        return counts

    counts = asyncio.run(go())
    # Before widgets/footer.py: ~20 more keys alive after every viewer opened and closed.
    assert max(counts) - min(counts) <= 5, counts  # ~200 more a round before
    assert max(counts) < 100, counts
