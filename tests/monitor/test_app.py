"""The TUI under Pilot: panes updating from a scripted event stream, and every key."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import pytest
from app_scenarios import NOW, RUN, alert_state, healthy, step_line
from monitor_helpers import typed_event
from rich.console import Console

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.alerts import AlertsPane
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.queues import QueuePane
from dflash_tui.widgets.restart_dialog import RestartDialog
from dflash_tui.widgets.screens import HelpScreen, RunsScreen
from dflash_tui.widgets.steplog import StepLog
from trainer.contract.protocol import Kill, Launch

SIZE = (160, 48)
TARGET = Target(name="gpu-box", kind="ssh", host="gpu-box")


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def plain(widget, width: int = 158) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def log_text(log: StepLog) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in log.lines)


def scripted_app(theme: str = "dark") -> DFlashApp:
    return DFlashApp(TARGET, theme_name=theme, connect=False, clock=lambda: NOW)


def run(coro):
    return asyncio.run(coro)


async def until(pilot, ok, timeout: float = 5.0) -> None:
    """The panes redraw on a 0.25 s timer, and one redraw with its render takes ~250 ms at
    160x48 on two shared cores (the plots a third of it): wait for what is read, not a
    fixed time."""
    deadline = time.monotonic() + timeout
    while not ok() and time.monotonic() < deadline:
        await pilot.pause(0.1)


def test_every_pane_updates_from_the_event_stream():
    async def go():
        app = scripted_app()
        async with app.run_test(size=SIZE) as pilot:
            assert "waiting for GPU" in plain(app.query_one(GpuPane))
            events = healthy()
            half = len(events) // 2
            for e in events[:half]:
                app.feed(typed_event(e))
            await until(pilot, lambda: "connected" in plain(app.query_one(StatusBar)))
            assert "connected" in plain(app.query_one(StatusBar))
            for e in events[half:]:
                app.feed(typed_event(e))
            await until(pilot, lambda: "training" in plain(app.query_one(StatusBar)))
            status = plain(app.query_one(StatusBar))
            assert RUN in status and "training  7h49m" in status and "12ms" in status
            gpus = plain(app.query_one(GpuPane))
            assert gpus.count("target") == 5 and gpus.count("drafter") == 3
            assert "/140G" in gpus and "95%" in gpus
            hb = plain(app.query_one(HeartbeatPane))
            assert "training for 7h49m" in hb and "running = deployed" in hb
            assert "nloj6lfc" in hb and "step 876" in hb and "14.2K tok/s" in hb
            assert "0 recompiles · cache 10 hit / 0 miss" in hb
            queues = plain(app.query_one(QueuePane))
            assert "q_pre[4]" in queues and "50/64" in queues and "q_hs[0]" in queues
            log = log_text(app.query_one(StepLog))
            assert "step=876" in log and "step=798" in log
            assert "nothing wrong" in plain(app.query_one(AlertsPane))

            for e in alert_state()[len(events) :]:
                app.feed(typed_event(e))
            await until(pilot, lambda: "critical" in plain(app.query_one(AlertsPane)))
            alerts = plain(app.query_one(AlertsPane))
            assert "critical" in alerts and "illegal memory access" in alerts
            assert "crashed" in plain(app.query_one(StatusBar))

    run(go())


def test_help_filter_follow_theme_and_runs_keys(tmp_path):
    async def go():
        app = scripted_app()
        async with app.run_test(size=SIZE) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            await pilot.pause(0.3)
            log = app.query_one(StepLog)

            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)

            await pilot.press("slash")
            await pilot.press(*"step=870")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert log.pattern == "step=870"
            shown = [ln for ln in log_text(log).splitlines() if ln.strip()]
            assert len(shown) == 1 and "step=870 " in shown[0]
            await pilot.press("slash", "ctrl+a", "ctrl+k", "enter")  # an empty filter
            await pilot.pause(0.2)
            assert log.pattern == "" and "step=876" in log_text(log)

            await pilot.press("f")  # pause: new lines wait
            assert log.following is False
            app.feed(
                typed_event(
                    {
                        "type": "line",
                        "t": NOW,
                        "run_id": RUN,
                        "file": "train.log",
                        "offset": 0,
                        "end": 0,
                        "text": step_line(878, 1.3, 15000, 479),
                    }
                )
            )
            await pilot.pause(0.4)
            assert "step=878" not in log_text(log)
            await pilot.press("f")
            await pilot.pause(0.4)
            assert "step=878" in log_text(log)

            assert app.theme == "dark"
            await pilot.press("t")
            assert app.theme == "high-contrast"
            await pilot.press("t")
            assert app.theme == "light"
            saved = json.loads((tmp_path / "config" / "dflash-tui" / "settings.json").read_text())
            assert saved["theme"] == "light"

            await pilot.press("l")
            assert isinstance(app.screen, RunsScreen)
            await pilot.press("escape")
            await pilot.pause(0.1)
            await pilot.press("enter")  # Enter opens the runs too
            assert isinstance(app.screen, RunsScreen)
            await pilot.press("escape")
            await pilot.pause(0.1)
            await pilot.press("q")
        assert app.return_code in (0, None)

    run(go())


def test_every_action_is_in_the_command_palette():
    async def go():
        app = scripted_app()
        async with app.run_test(size=SIZE):
            titles = {c.title for c in app.get_system_commands(app.screen)}
        bound = {b.action for b in app.BINDINGS} - {"quit"}
        assert bound == {a for _, _, a in app.PALETTE}
        assert {"Kill the run", "Restart the run", "Dump stacks", "Next theme"} <= titles

    run(go())


def test_a_remembered_theme_is_used_next_time():
    from dflash_tui.themes import remember_theme

    remember_theme("high-contrast")
    app = DFlashApp(TARGET, connect=False, clock=lambda: NOW)
    assert app.theme == "high-contrast"


# -- the control keys, against a real agent and a real trainer -----------------------


@pytest.fixture
def live_remote(tmp_path):
    """A local remote dir with the trainer deployed and a tiny run alive."""
    from monitor_helpers import NO_WANDB, TINY, Remote
    from test_control_local import deploy

    target = Target(
        name="local", kind="local", remote_dir=str(tmp_path / "remote"), python=sys.executable
    )
    r = Remote(target)
    deploy(r)
    run_id = r.request(
        Launch(
            config_toml=TINY.read_text(),
            name="tiny-cpu",
            overrides=[NO_WANDB, "train.max_steps=100000"],
        )
    )["run_id"]
    r.wait(lambda s: s.heartbeat and s.heartbeat.phase == "training", 90, "training")
    yield target, run_id, r
    with contextlib.suppress(Exception):
        r.request(Kill(timeout_s=10, drain_timeout_s=5), timeout=40)
    r.close()


def plain_label(screen, selector: str) -> str:
    return str(screen.query_one(selector).label)


async def restarted(pilot, app: DFlashApp) -> str:
    """The new run id and what it continues, from the restart's toast (toasts expire: the
    last one is this restart's)."""
    for _ in range(600):
        await pilot.pause(0.1)
        if app.controls.busy is None:
            break
    done = [n.message for n in app._notifications if n.message.startswith("restarted as ")]
    assert done, [n.message for n in app._notifications]
    return done[-1].removeprefix("restarted as ")


@pytest.mark.serial  # kill, restart twice and a drain on one host: not beside another trainer
def test_control_keys_drive_the_real_run(live_remote):
    target, run_id, _r = live_remote

    async def go():
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            # Up to 60 s: the live run's trainer is still starting on a loaded machine, and a
            # dump asked for before it trains is refused (no screen opens).
            # And until the agent has said the run is alive (its liveness or runs list): before
            # that, controls are refused in a toast that is gone by the time this test looks.
            def live() -> bool:
                hb = app.store.heartbeat
                alive = app.store.alive_run is not None or app.store.process_alive() is True
                return bool(hb and hb.phase == "training" and alive)

            for _ in range(600):
                await pilot.pause(0.1)
                if live():
                    break
            assert app.store.run_id == run_id
            assert app.store.heartbeat and app.store.heartbeat.phase == "training"

            # d: the dump opens in a scrollable screen
            await pilot.press("d")
            for _ in range(100):
                await pilot.pause(0.1)
                # the screen, once composed (its class is there a frame before its body)
                if app.screen.__class__.__name__ == "TextScreen" and app.screen.query("#body"):
                    break
            notes = [n.message for n in app._notifications]
            assert app.screen.query("#body"), (app.screen, app.controls.busy, notes)
            body = plain(app.screen.query_one("#body"))
            assert 'Thread "drafter-0"' in body
            await pilot.press("escape")

            # c: refused at once while the run is alive, before any "Delete?"
            await pilot.press("c")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, TypedConfirm)
            assert any("is alive" in n.message for n in app._notifications)

            # K (k scrolls): y and Enter do not confirm, Esc cancels: nothing happens
            await pilot.press("K")
            await pilot.press("y", "enter", "escape")
            await pilot.pause(0.5)
            assert app.store.process_alive() is True and app.controls.busy is None

            # K twice: one kill only (the word typed), the second press is told to wait
            await pilot.press("K")
            await pilot.press("k", "i", "l", "l", "enter")
            await pilot.pause(0.05)
            await pilot.press("K")
            assert any("still running" in n.message for n in app._notifications)
            for _ in range(900):  # a loaded CI machine: the stop can take a while
                await pilot.pause(0.1)
                if app.controls.busy is None:
                    break
            killed = [n.message for n in app._notifications if "stopped at step" in n.message]
            assert len(killed) == 1 and killed[0].startswith(f"{run_id} stopped at step ")
            assert "(SIGTERM), checkpoint checkpoints/step-" in killed[0]
            assert "— resumable with restart" in killed[0]
            for _ in range(50):  # liveness is re-checked every second
                await pilot.pause(0.1)
                if app.store.process_alive() is False:
                    break
            assert app.store.process_alive() is False
            runs = Path(target.remote_dir) / "runs"
            stopped = json.loads((runs / run_id / "exit.json").read_text())["step"]
            checkpoint = f"checkpoints/step-{stopped:08d}.pt"
            for _ in range(50):  # the runs list after the stop: its newest good checkpoint
                await pilot.pause(0.1)
                run = app.store.current_run()
                if run and run.resume and run.resume.step == stopped:
                    break

            # r asks which; a stray letter confirms nothing, escape sends nothing
            await pilot.press("r")
            await pilot.pause(0.2)
            assert isinstance(app.screen, RestartDialog)
            assert plain_label(app.screen, "#resume") == f"Resume from step {stopped}"
            assert not app.screen.query("#fresh")  # step 0 takes a typed word, not a button
            await pilot.press("f", "r", "y")
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, RestartDialog) and app.controls.busy is None
            assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == [run_id]

            # r, then Enter on the focused resume: from that checkpoint into a new run dir,
            # which the app follows
            await pilot.press("r")
            await pilot.pause(0.2)
            await pilot.press("enter")
            new_id = await restarted(pilot, app)
            assert new_id.endswith(f", resuming from {checkpoint} (step {stopped}) of {run_id}")
            new_id = new_id.split(",")[0]
            launched = json.loads((runs / new_id / "launch.json").read_text())
            assert launched["resumed_from"] == run_id and launched["checkpoint"] == checkpoint
            for _ in range(300):
                await pilot.pause(0.1)
                if app.store.run_id == new_id and app.store.step_lines:
                    break
            assert app.store.run_id == new_id and app.store.step_lines
            said = (runs / new_id / "train.log").read_text()  # the trainer's own word
            assert f"resumed from {runs / run_id / checkpoint} at step {stopped}" in said

            # r on the alive run, then `fresh` typed: it is stopped, and step 0 again
            await pilot.press("r")
            await pilot.pause(0.2)
            assert plain_label(app.screen, "#resume").startswith("Resume from where it stops")
            await pilot.click("#fresh-word")
            await pilot.press(*"fresh", "enter")
            fresh = await restarted(pilot, app)
            assert fresh.endswith(", fresh from step 0 (as asked)")
            fresh_id = fresh.split(",")[0]
            assert fresh_id != new_id
            assert json.loads((runs / fresh_id / "launch.json").read_text())["resumed_from"] is None
            assert any(
                n.message.startswith(f"{new_id} stopped at step") for n in app._notifications
            )

            await pilot.press("q")
        # q leaves the remote run alone
        assert not (Path(target.remote_dir) / "runs" / fresh_id / "exit.json").exists()

    run(go())


def test_a_named_targets_theme_is_used():
    target = Target(name="box", kind="local", extra={"theme": "light"})
    assert DFlashApp(target, connect=False, clock=lambda: NOW).theme == "light"
