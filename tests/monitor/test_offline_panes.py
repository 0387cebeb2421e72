"""Honest states in the TUI (issue 16): while not connected one note says so, and why, and
control keys are refused at once; connected with no run, the panes name the run root and
`k` says there is no run. The real app under Pilot over a real link: a target whose
connection is refused, and the real local agent on an empty run root."""

from __future__ import annotations

import asyncio
import io
import socket
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.offline import OfflineBlank, OfflineNote
from dflash_tui.widgets.restart_dialog import RestartDialog

SIZE = (160, 48)
EMPTY_STATES = ("waiting for GPU samples", "no run under the run root yet", "no queues yet")


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)


def plain(widget, width: int = 158) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def screen_text(app: DFlashApp) -> str:
    """What the screen shows, every visible widget's text (the plots' canvases aside)."""
    return "\n".join(
        plain(w)
        for w in app.screen.query("Static")
        if w.display and w.parent is not None and w.parent.display
    )


async def until(pilot, ok, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not ok() and time.monotonic() < deadline:
        await pilot.pause(0.1)
    return bool(ok())


def refused_target() -> Target:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Target(name=f"ssh://127.0.0.1:{port}", kind="ssh", host="127.0.0.1", port=port)


def toasts(app: DFlashApp) -> list[str]:
    return [n.message for n in app._notifications]


def test_a_refused_connection_is_said_in_every_pane_and_control_keys_are_refused():
    target = refused_target()

    async def go() -> None:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            notes = list(app.query(OfflineNote))
            assert len(notes) == 1  # said once, under the header, not in every pane
            note = notes[0]
            assert await until(pilot, lambda: "Connect call failed" in plain(note)), plain(note)
            text = plain(note).strip()
            assert text.startswith(f"not connected to {target.name}: 127.0.0.1:"), text
            assert "unreachable: [Errno 111] Connect call failed" in text
            assert "(retrying in " in text or "(trying again)" in text, text
            assert note.display
            # The panes that never had a connection: a blank, not the note again, not
            # their empty states (GPUs, heartbeat, stages, step log, queues, alerts, plots).
            blanks = list(app.query(OfflineBlank))
            assert len(blanks) == 7 and all(b.display for b in blanks)
            shown = screen_text(app)
            assert shown.count("Connect call failed") == 1, shown
            for empty in EMPTY_STATES:
                assert empty not in shown, (empty, shown)

            # Control keys: refused at once, one toast saying why, no dialog.
            for key, action in (("K", "kill"), ("d", "dump stacks"), ("c", "clear cache")):
                before = len(app._notifications)
                await pilot.press(key)
                await pilot.pause(0.05)
                assert not isinstance(app.screen, TypedConfirm | RestartDialog), key
                new = toasts(app)[before:]
                assert len(new) == 1, new
                assert new[0].startswith(f"{action}: not connected to {target.name}: "), new
                assert app.controls.busy is None
            await pilot.press("r")
            await pilot.pause(0.05)
            assert not isinstance(app.screen, RestartDialog)
            assert toasts(app)[-1].startswith(f"restart: not connected to {target.name}")

    asyncio.run(go())


def test_with_no_run_the_panes_name_the_run_root_and_k_says_there_is_none(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    target = Target(
        name="local",
        kind="local",
        remote_dir=str(tmp_path / "remote"),
        run_root=str(root),
        python=sys.executable,
    )

    async def go() -> None:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: f"no run under {root} yet" in screen_text(app))
            assert not any(n.display for n in app.query(OfflineNote))  # connected: no notes
            await pilot.press("K")
            await pilot.pause(0.05)
            assert not isinstance(app.screen, TypedConfirm)
            assert toasts(app)[-1] == f"kill: no run under {root} yet"
            assert not any("Kill run" in t for t in toasts(app))

    asyncio.run(go())


def test_a_lost_connection_keeps_the_last_picture_under_the_note(tmp_path):
    """Connected, then the agent's host goes away: the panes keep what they showed (stale,
    and said to be), under a note that says why and when the link tries again."""
    root: Path = tmp_path / "runs"
    root.mkdir()
    target = Target(
        name="local",
        kind="local",
        remote_dir=str(tmp_path / "remote"),
        run_root=str(root),
        python=sys.executable,
    )

    async def go() -> None:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: f"no run under {root} yet" in screen_text(app))
            app.link.transport.target = Target(  # the next session's agent cannot start
                name="local", kind="local", run_root=str(root), python="/nonexistent/python"
            )
            app.link._agent.terminate()  # the session drops, as a host that goes away
            note = app.query_one(OfflineNote)
            assert await until(pilot, lambda: note.display)
            text = plain(note)
            assert text.startswith("not connected to local: "), text
            assert f"no run under {root} yet" in screen_text(app)  # the last picture stays
            assert not any(b.display for b in app.query(OfflineBlank))

    asyncio.run(go())
