"""The thread/process table (T) on a real CPU trainer through the local agent: every
pipeline thread by name and role, the trainer's process with its RSS, Enter on a thread for
its stack, Enter on the trainer for a signal (SIGUSR2: faulthandler's dump), and the agent
refusing any pid outside the run's proven group even when asked directly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import NO_WANDB, ROOT, TINY, Remote
from test_control_local import deploy

from dflash_tui.agent.procs import proc_start
from dflash_tui.link.link import LinkError
from dflash_tui.stages import PIPELINE_ROLES
from dflash_tui.targets import Target
from trainer.contract.protocol import Kill, Launch, SignalProcess

# A stack dump has 2 s for its named form: not beside another test's trainer.
pytestmark = pytest.mark.serial


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Target, Remote]]:
    target = Target(
        name="local", kind="local", remote_dir=str(tmp_path / "remote"), python=sys.executable
    )
    r = Remote(target)
    try:
        deploy(r)
        r.request(
            Launch(
                config_toml=TINY.read_text(),
                name="tiny-cpu",
                overrides=[NO_WANDB, "train.max_steps=100000"],
            )
        )
        r.wait(lambda s: s.heartbeat and s.heartbeat.phase == "training", 180, "training")
        r.wait(lambda s: s.procs is not None and s.procs.pgid, 30, "a procs sample")
        yield target, r
    finally:
        with contextlib.suppress(Exception):
            r.request(Kill(timeout_s=10, drain_timeout_s=5), timeout=40)
        r.close()


def test_the_agent_refuses_every_pid_outside_the_runs_group(live: tuple[Target, Remote]) -> None:
    _target, r = live
    procs = r.store.procs
    assert procs is not None and procs.leader == r.store.heartbeat.pid
    trainer = next(p for p in procs.procs if p.pid == procs.leader)
    outsider = subprocess.Popen(["sleep", "120"])
    try:
        start = proc_start(outsider.pid)
        assert start is not None
        with pytest.raises(LinkError, match=rf"pid {outsider.pid}: not signalled: it is in "):
            r.request(SignalProcess(pid=outsider.pid, start=start, signal="SIGKILL"))
        assert outsider.poll() is None  # alive: nothing reached it
        # the trainer's pid with another start time: not the process the table listed
        with pytest.raises(LinkError, match=r"has exited \(or the pid is another process now\)"):
            r.request(SignalProcess(pid=trainer.pid, start=trainer.start + 1, signal="SIGTERM"))
        with pytest.raises(LinkError, match="'SIGSTOP': not one a row may send"):
            r.request(SignalProcess(pid=trainer.pid, start=trainer.start, signal="SIGSTOP"))
        for pid in (0, 1, -1):
            with pytest.raises(LinkError, match="not signalled"):
                r.request(SignalProcess(pid=pid, start=0, signal="SIGTERM"))
    finally:
        outsider.kill()
        outsider.wait()
    step = r.store.heartbeat.step
    r.wait(lambda s: s.heartbeat.step > step, 60, "training goes on: nothing was signalled")

    # status --json carries the run's processes, the trainer's CPU use measured already
    hello = r.store.hello
    assert hello is not None
    out = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "status", "local", "--run-root", hello.run_root,
         "--remote-dir", hello.remote_dir, "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    snap = json.loads(out.stdout.splitlines()[0])["state"]["procs"]
    assert snap["pgid"] == procs.pgid and snap["leader"] == trainer.pid, snap
    (listed,) = [p for p in snap["procs"] if p["pid"] == trainer.pid]
    assert listed["start"] == trainer.start and listed["rss"] > 0 and listed["cpu_pct"] > 0


def cells(screen: Any) -> dict[str, list[str]]:
    """The threads table as text, by row key."""
    from textual.widgets import DataTable

    table = screen.query_one(DataTable)
    return {str(key.value): [str(c) for c in table.get_row(key)] for key in list(table.rows)}


async def until(pilot: Any, test: Any, what: str, tries: int = 300) -> Any:
    for _ in range(tries):
        await pilot.pause(0.1)
        got = test()
        if got:
            return got
    raise AssertionError(f"timed out waiting for {what}")


def test_the_table_lists_the_threads_and_processes_and_acts_on_rows(
    live: tuple[Target, Remote], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    from dflash_tui.app import DFlashApp
    from dflash_tui.widgets.dialogs import TypedConfirm
    from dflash_tui.widgets.screens import TextScreen
    from dflash_tui.widgets.thread_table import ThreadsScreen

    target, r = live
    run_dir = Path(r.store.run_dir or "")
    fallback = run_dir / "stacks-sigusr2.txt"

    async def go() -> None:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=(200, 50)) as pilot:
            await until(
                pilot,
                lambda: app.store.heartbeat and app.store.procs and app.store.procs.pgid,
                "the run's heartbeat and processes",
            )
            await pilot.press("T")
            screen = await until(
                pilot,
                lambda: isinstance(app.screen, ThreadsScreen) and app.screen.rows and app.screen,
                "the threads screen",
            )
            hb, procs = app.store.heartbeat, app.store.procs
            rows = cells(screen)
            pipeline = [t for t in hb.threads if t.role in PIPELINE_ROLES]
            assert {t.role for t in pipeline} == set(PIPELINE_ROLES)
            for t in pipeline:  # every pipeline thread, by name, with its role and device
                row = rows[f"thread:{t.name}"]
                assert row[1:4] == [t.name, t.role, t.device], row
            drafter = rows["thread:drafter-0"]
            assert drafter[8].startswith(("forward ", "backward ")), drafter  # slowest stage
            assert drafter[9].endswith("ms") or drafter[9].endswith("s"), drafter  # loop
            trainer = next(p for p in procs.procs if p.pid == hb.pid)
            assert trainer.rss > 0 and procs.leader == hb.pid
            row = rows[f"proc:{trainer.pid}:{trainer.start}"]
            assert row[1].startswith(f"{trainer.pid} ") and row[2] == "trainer", row
            assert row[7].endswith(("MB", "GB")), row  # its RSS
            # the launch wrapper, the trainer's parent, in a group of its own: shown, last
            launch = json.loads((run_dir / "launch.json").read_text())
            assert procs.wrapper is not None and procs.wrapper.pid == launch["wrapper_pid"]
            assert trainer.ppid == procs.wrapper.pid
            wrap_key = f"proc:{procs.wrapper.pid}:{procs.wrapper.start}"
            assert list(rows)[-1] == wrap_key and rows[wrap_key][2] == "wrap"
            meters = str(screen.query_one("#meters").render())
            assert f"of {app.store.host.cpus} CPUs" in meters and "RAM" in meters, meters
            print("\n".join(" | ".join(v) for v in rows.values()))

            # s: the busiest thread first
            await pilot.press("s")
            await pilot.pause(0.2)
            order = [v for k, v in screen.rows.items() if k.startswith("thread:")]
            shares = [v.cpu_pct for v in order]
            assert shares == sorted(shares, reverse=True), shares
            await pilot.press("s")
            await pilot.pause(0.2)

            # j / k move the cursor
            table = screen.query_one("#threads")
            table.move_cursor(row=0)
            await pilot.press("j")
            assert table.cursor_row == 1
            await pilot.press("k")
            assert table.cursor_row == 0

            # Enter on a thread row: that thread's part of the newest dump; none taken yet,
            # so it says how (a viewer sends nothing), and d on the dashboard takes one
            table.move_cursor(row=list(screen.rows).index("thread:drafter-0"))
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert isinstance(app.screen, ThreadsScreen)
            assert "d on the dashboard takes one" in list(app._notifications)[-1].message
            await pilot.press("escape", "d")
            await until(
                pilot,
                lambda: isinstance(app.screen, TextScreen) and app.screen.query("#body"),
                "the dump",
            )
            await pilot.press("escape", "T")
            screen = await until(
                pilot,
                lambda: isinstance(app.screen, ThreadsScreen) and app.screen.rows and app.screen,
                "the threads screen again",
            )
            table = screen.query_one("#threads")
            table.move_cursor(row=list(screen.rows).index("thread:drafter-0"))
            await pilot.press("enter")
            stack = await until(
                pilot,
                lambda: isinstance(app.screen, TextScreen) and app.screen.query("#body"),
                "the stack screen",
            )
            assert stack
            title = str(app.screen.query_one("#title").render())
            body = str(app.screen.query_one("#body").render())
            assert title.startswith("Stack of thread drafter-0"), title
            assert '"drafter-0"' in body.splitlines()[0], body[:300]
            assert '"target-0"' not in body and "File " in body, body[:600]
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, ThreadsScreen), "back")

            # Enter on the trainer's row: the signal dialog; u sends SIGUSR2 (a C-level dump)
            await until(pilot, lambda: app.controls.busy is None, "the dump's command to end")
            before = fallback.stat().st_size
            key = f"proc:{trainer.pid}:{trainer.start}"
            table.move_cursor(row=list(screen.rows).index(key))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, TypedConfirm), "the signal dialog")
            await pilot.press("u", "enter")  # a letter is no signal's name: nothing sent
            await pilot.pause(0.3)
            assert isinstance(app.screen, TypedConfirm)
            await pilot.press(*"sigusr2", "enter")  # the name, typed (any case)
            sent = await until(
                pilot,
                lambda: [n.message for n in app._notifications if "SIGUSR2 sent" in n.message],
                "the signal's answer",
            )
            assert sent[-1] == (
                f"SIGUSR2 sent to pid {trainer.pid} (process group {procs.pgid} of run "
                f"{app.store.run_id})"
            )
            await until(pilot, lambda: fallback.stat().st_size > before, "faulthandler's dump")
            await pilot.pause(0.5)
            added = fallback.read_text()[before:]
            assert "most recent call first" in added, added[:500]
            assert isinstance(app.screen, ThreadsScreen)  # the dialog has gone

            # Enter on the wrapper's row: said, no signal offered
            await until(pilot, lambda: app.controls.busy is None, "the signal's command to end")
            table.move_cursor(row=list(screen.rows).index(wrap_key))
            await pilot.press("enter")
            said = await until(
                pilot,
                lambda: [n.message for n in app._notifications if "launch wrapper" in n.message],
                "the wrapper's note",
            )
            assert said[-1].startswith(f"pid {procs.wrapper.pid} is the launch wrapper")
            assert isinstance(app.screen, ThreadsScreen)

    asyncio.run(go())
    step = r.store.heartbeat.step
    # Training goes on, or the run died of SIGSEGV: faulthandler's C-level dump reads the other
    # threads' frames as they change, which CPython says may crash (python/cpython#116008; the
    # dialog says so, and CI saw it once in 12-07's runs). Nothing else may end it.
    ended = r.wait(
        lambda s: s.heartbeat.step > step or s.exit_info(), 60, "training goes on after SIGUSR2"
    )
    if ended is not True:
        assert r.store.exit_info().signal == "SIGSEGV", r.store.exit_info()
