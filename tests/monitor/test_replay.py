"""`dflash-tui replay`: a crashed run's telemetry scrubbed with the TUI's own panes.

The run dir is a real one (tests/fixtures/rundirs/replay-crash, its README says how it was
recorded: a tiny CPU run whose drafter thread raised at item 150). The real app runs under
Pilot over a real local agent, which reads the run dir's files as it does on a GPU host;
what the screen shows at an entry is compared with that entry read from telemetry.jsonl
here, independently of the replay's reader.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from dflash_tui.app import DFlashApp
from dflash_tui.replay import recording
from dflash_tui.targets import Target
from dflash_tui.widgets.alerts import AlertsPane
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.queues import QueuePane
from dflash_tui.widgets.replay import ReplayBar, ReplayScreen
from dflash_tui.widgets.steplog import StepLog

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "rundirs" / "replay-crash"
RUN = "20261202-160630-tiny-cpu-56b8"
SIZE = (160, 48)


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(RECORDED, root, ignore=shutil.ignore_patterns("README.md"))
    return root


def target_for(runs: Path) -> Target:
    return Target(
        name="local",
        kind="local",
        remote_dir=str(runs.parent / "remote"),
        run_root=str(runs),
        python=sys.executable,
    )


def entries(runs: Path) -> list[dict]:
    """telemetry.jsonl read here, as plain JSON: what the screen must agree with."""
    lines = (runs / RUN / "telemetry.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def plain(widget, width: int = 158) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def log_text(log: StepLog) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in log.lines)


async def until(pilot, ok, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok() and time.monotonic() < deadline:
        await pilot.pause(0.1)
    assert ok(), "not within the time"


def replay_screen(app: DFlashApp) -> ReplayScreen:
    screen = app.screen
    assert isinstance(screen, ReplayScreen), type(screen)
    return screen


def bar(app: DFlashApp) -> str:
    """The replay bar's text; "" before the screen has composed it."""
    found = app.screen.query(ReplayBar)
    return plain(found.first()) if found else ""


def pane(app: DFlashApp, cls) -> str:
    return plain(app.screen.query_one(cls))


def test_replay_opens_at_the_crash_and_steps_back_to_each_entry_as_written(runs):
    beats = entries(runs)
    n = len(beats)
    assert n >= 15 and beats[-1]["phase"] == "crashed"

    async def go():
        app = DFlashApp(target_for(runs), theme_name="dark", replay=(RUN, None))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: f"entry {n}/{n}" in bar(app))
            # The end: the crash, its error, and the rule that says so, at that moment.
            top = bar(app)
            assert "REPLAY" in top and "(the end)" in top and "step 150" in top
            assert "GPU util/power: not recorded" in top
            gpus = pane(app, GpuPane)  # what the run dir has instead: the trainer's memory
            alloc = beats[-1]["memory"]["cpu"]["allocated"] / 2**30
            assert "not recorded in the run dir" in gpus and f"cpu {alloc:.1f}G" in gpus
            assert "crashed" in pane(app, StatusBar)
            alerts = pane(app, AlertsPane)
            assert "critical" in alerts and "crashed in drafter-0" in alerts
            assert "InjectedFault: injected fault in drafter at item 150" in alerts
            assert "Traceback" in log_text(app.screen.query_one(StepLog))

            # Back 6 entries: that entry's step, queues and time, as the file says them.
            for _ in range(6):
                await pilot.press("left")
            i = n - 7
            want = beats[i]
            await until(pilot, lambda: f"entry {i + 1}/{n}" in bar(app))
            before = beats[-1]["now"] - want["now"]
            top = bar(app)
            assert f"step {want['step']}" in top and "before the end" in top
            assert f"-{int(before)}s before the end" in top, top
            assert f"step {want['step']}" in pane(app, HeartbeatPane)
            queues = pane(app, QueuePane)
            for q in want["queues"]["q_pre"] + want["queues"]["q_hs"]:
                assert f"{q['depth']}/{q['capacity']}" in queues
            assert "training" in pane(app, StatusBar)
            alerts = pane(app, AlertsPane)
            assert "crashed" not in alerts  # the rules at that moment: it had not crashed
            # The step log ends where the run's log had got to by then.
            log = log_text(app.screen.query_one(StepLog))
            assert f"step={want['step'] // 10 * 10} " in log
            assert f"step={want['step'] // 10 * 10 + 10} " not in log

            # A minute back: the newest entry at least 60 s before this one.
            await pilot.press("left_square_bracket")
            j = max(k for k in range(n) if beats[k]["now"] <= want["now"] - 60)
            await until(pilot, lambda: f"entry {j + 1}/{n}" in bar(app))
            await pilot.press("home")
            await until(pilot, lambda: f"entry 1/{n}" in bar(app))
            await pilot.press("e")
            await until(pilot, lambda: f"entry {n}/{n}" in bar(app))

    asyncio.run(go())


def test_control_keys_are_refused_in_replay_and_escape_returns_to_live(runs):
    async def go():
        app = DFlashApp(target_for(runs), theme_name="dark", replay=(RUN, "-30s"))
        said: list[str] = []
        notify = app.notify

        def spy(message, **kw):
            said.append(message)
            notify(message, **kw)

        app.notify = spy  # type: ignore[method-assign]
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "before the end" in bar(app))
            for key in ("K", "r", "d", "c"):
                await pilot.press(key)
                await pilot.pause(0.1)
                assert isinstance(app.screen, ReplayScreen)  # no confirm, no restart choice
            app.action_kill()  # the command palette's way in
            await pilot.pause(0.1)
            assert not isinstance(app.screen, TypedConfirm)
            refused = [m for m in said if "control keys are disabled" in m]
            assert len(refused) == 5, said

            # `/` filters the replayed log at its moment; the live log keeps its own filter
            log = app.screen.query_one(StepLog)
            await pilot.press("slash", *"step=", "enter")
            await pilot.pause(0.2)
            assert log.pattern == "step=" and isinstance(app.screen, ReplayScreen)
            assert app.screen_stack[0].query_one(StepLog).pattern == ""

            await pilot.press("escape")
            assert not isinstance(app.screen, ReplayScreen)
            # Live: the same run, followed through the link, as it is now (it crashed).
            await until(pilot, lambda: "connected" in plain(app.query_one(StatusBar)))
            await until(pilot, lambda: "crashed" in plain(app.query_one(StatusBar)))
            assert "REPLAY" not in plain(app.query_one(StatusBar))

    asyncio.run(go())


def test_p_in_the_live_tui_replays_the_followed_run(runs):
    async def go():
        app = DFlashApp(target_for(runs), theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: RUN in plain(app.query_one(StatusBar)))
            await pilot.press("p")
            screen = replay_screen(app)
            assert screen.run_id == RUN
            await until(pilot, lambda: "(the end)" in bar(app))
            await pilot.press("left")
            await until(pilot, lambda: "before the end" in bar(app))
            await pilot.press("escape")
            assert not isinstance(app.screen, ReplayScreen)

    asyncio.run(go())


EVIL = "\x1b]0;pwned\x07[bold red]boom[/] \u202eevil"


def hostile(runs: Path) -> dict:
    """Append hostile lines to the copy's telemetry.jsonl: garbage, a heartbeat of no
    schema, one with a time that is no time, and one (between two real entries) whose
    strings carry escapes and markup and whose queue depth is absurd; and a metrics.jsonl
    row that is none."""
    path = runs / RUN / "telemetry.jsonl"
    beats = entries(runs)
    evil = json.loads(json.dumps(beats[-3]))
    evil["now"] = (beats[-3]["now"] + beats[-2]["now"]) / 2
    evil["step"] = 10**30
    evil["queues"]["q_hs"][0]["depth"] = 10**30
    evil["host"] = EVIL
    for thread in evil["threads"]:
        thread["state"] = EVIL
    no_time = dict(beats[-4], now=float("inf"))
    with open(path, "a", encoding="utf-8") as f:
        f.write("this is not json\n")
        f.write('{"schema": "x"}\n')
        f.write(json.dumps(no_time) + "\n")  # Infinity: JSON as Python writes it
        f.write(json.dumps(evil) + "\n")
        f.write("\x1b[2J\x1b[31m" + "9" * 5000 + "\n")
    with open(runs / RUN / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": "many", "loss": 1e999}\n')  # a metrics row that is none
    return evil


def test_hostile_telemetry_lines_are_skipped_counted_and_made_visible(runs):
    n = len(entries(runs)) + 1  # the real entries and the evil one; the other four are out
    evil = hostile(runs)

    async def go():
        app = DFlashApp(target_for(runs), theme_name="dark", replay=(RUN, None))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: f"entry {n}/{n}" in bar(app))
            assert "5 unreadable lines skipped" in bar(app)
            assert "5 malformed lines skipped" in pane(app, StatusBar)
            for _ in range(2):
                await pilot.press("left")
            await until(pilot, lambda: f"entry {n - 2}/{n}" in bar(app))
            assert f"step {evil['step']}" in bar(app)
            queues = pane(app, QueuePane)
            # bounded, labelled, not a 31-digit count
            assert f">1e12 (implausible)/{evil['queues']['q_hs'][0]['capacity']}" in queues
            screen_text = "\n".join(plain(w) for w in app.screen.query("Static"))
            assert "\x1b" not in screen_text and "\u202e" not in screen_text
            # Shown, as text: the escapes visible, the markup not read as markup.
            assert "on \\x1b]0;pwned\\x07[bold red]boom[/] \\u202eevil" in screen_text
            assert "'\\x1b]0;pwned\\x07[bold red]boom[/]" in screen_text  # the stage bars
            await pilot.press("e")
            await until(pilot, lambda: f"entry {n}/{n}" in bar(app))
            assert "crashed" in pane(app, StatusBar)

    asyncio.run(go())


# -- headless, through the CLI -----------------------------------------------------------------
def replay_cli(runs: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TZ="UTC", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", "replay", RUN, "local", "--run-root", str(runs),
         "--python", sys.executable, *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip


def test_headless_at_prints_the_status_at_that_moment(runs):
    beats = entries(runs)
    end = beats[-1]["now"]
    r = replay_cli(runs, "--headless", "--at", "-1m")
    want = max((b for b in beats if b["now"] <= end - 60), key=lambda b: b["now"])
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = r.stdout.splitlines()[:2]
    assert "training" in first and f"step {want['step']}" in first and "[replay]" in first
    assert time.strftime("%H:%M:%S", time.gmtime(want["now"])) in first
    assert "before the end" in second and "GPU util/power not recorded" in second

    # A clock time, as JSON: status's snapshot at that entry.
    clock = time.strftime("%H:%M:%S", time.gmtime(beats[5]["now"] + 0.5))
    r = replay_cli(runs, "--json", f"--at={clock}")
    assert r.returncode == 0, r.stdout + r.stderr
    snap = json.loads(r.stdout)
    assert snap["kind"] == "snapshot" and snap["replay"]["entry"] == 6
    assert snap["state"]["step"] == beats[5]["step"]
    # The recorded trainer had only fixed routing: its queues read as that (Queues.routing).
    assert snap["state"]["queues"] == {"routing": "fixed", **beats[5]["queues"]}
    assert snap["replay"]["gpu_samples"] is False

    # The end: the crash is critical, as `status` says it (exit 2).
    r = replay_cli(runs, "--headless")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "crashed" in r.stdout and "InjectedFault" in r.stdout


def test_headless_refuses_a_bad_at_and_an_unknown_run_in_one_line(runs):
    r = replay_cli(runs, "--headless", "--at", "yesterday")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--at 'yesterday': not a time" in r.stderr
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "replay", "no-such-run", "local", "--run-root",
         str(runs), "--headless"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert r.returncode == 2
    assert "no run 'no-such-run'" in r.stderr and "Traceback" not in r.stderr


def test_notify_still_pages_for_the_live_run_while_a_replay_is_open(tmp_path, runs):
    """The live store goes on being fed under the replay: a live crash must still page
    (--notify), whatever moment of the past is on screen. The live run here is the recorded
    SIGKILL scenario (a real run killed -9), fed to the real TUI."""
    from monitor_helpers import typed_event
    from test_diagnosis import NOW, events

    got = tmp_path / "paged.jsonl"
    folder = runs / RUN
    rec = recording(
        RUN,
        (folder / "telemetry.jsonl").read_text(),
        (folder / "metrics.jsonl").read_text(),
        (folder / "train.log").read_text(),
    )

    async def go() -> None:
        app = DFlashApp(
            Target(name="cpu-box", kind="ssh", host="cpu-box"), theme_name="dark",
            connect=False, clock=lambda: NOW, notify_command=f"cat >> {got}",
        )  # fmt: skip
        async with app.run_test(size=SIZE) as pilot:
            app.push_screen(ReplayScreen(RUN, "-30s", recording=rec))
            await until(pilot, lambda: "before the end" in bar(app))
            for e in events("recorded/killed_sigkill.jsonl"):
                app.feed(typed_event(e))
            await until(pilot, lambda: got.exists() and got.read_text().strip() != "")
            assert isinstance(app.screen, ReplayScreen)
            assert "before the end" in bar(app)  # the replay stayed where it was

    asyncio.run(go())
    pages = [json.loads(line) for line in got.read_text().splitlines()]
    assert "killed" in [p["finding"]["code"] for p in pages]


def test_a_long_telemetry_is_paged_back_in_whole_lines_through_the_agent(runs):
    """One answer holds a page; a longer file is read back a page of whole lines at a time
    (here pages of 8 KB, a heartbeat being ~5 KB): what arrives is the file, byte for byte;
    with a smaller budget, its newest whole lines, and it says older ones were left."""
    from dflash_tui.link.link import Link
    from dflash_tui.replay_source import read_back
    from dflash_tui.state import Store

    path = runs / RUN / "telemetry.jsonl"
    raw = path.read_bytes()

    async def go():
        store = Store("local")
        link = Link(target_for(runs), store.apply, follow=None)
        link.start()
        try:
            await link.wait_connected(30)
            whole, cut = await read_back(link, "telemetry.jsonl", RUN, 1 << 20, page=8192)
            assert whole.encode() == raw and not cut
            part, cut = await read_back(link, "telemetry.jsonl", RUN, 30_000, page=8192)
            assert cut and raw.endswith(part.encode()) and part.endswith("\n")
            newest = [line for line in raw.decode().splitlines(keepends=True)]
            kept = part.splitlines(keepends=True)
            assert kept == newest[-len(kept) :] and len(part) <= 30_000
            assert len(part) + len(newest[-len(kept) - 1]) > 30_000  # no older line fits
        finally:
            await link.close()

    asyncio.run(go())


def test_the_bar_says_when_only_the_end_of_the_telemetry_was_read(runs, monkeypatch):
    from dflash_tui import replay

    monkeypatch.setitem(replay.TAIL_BYTES, "telemetry.jsonl", 30_000)
    raw = (runs / RUN / "telemetry.jsonl").read_bytes()
    tail = raw[-30_000:]
    n = tail[tail.index(b"\n") + 1 :].count(b"\n")  # the whole lines in its last 30 KB

    async def go():
        app = DFlashApp(target_for(runs), theme_name="dark", replay=(RUN, None))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: f"entry {n}/{n}" in bar(app))
            assert "only the end of telemetry.jsonl read: older lines left" in bar(app)
            assert "unreadable" not in bar(app)  # no partial line was read as one
            assert "crashed" in pane(app, StatusBar)

    asyncio.run(go())
