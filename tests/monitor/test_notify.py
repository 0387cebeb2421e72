"""`--notify CMD`: a critical finding that appears or clears runs CMD with the finding as JSON
on stdin. Real runs, the real CLI, the real TUI under Pilot, a real `sh`: the command here
appends its stdin to a file, as `cat >> file` or a pager's `curl -d @-` would read it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, typed_event
from test_diagnosis import NOW, events

from dflash_tui.app import DFlashApp
from dflash_tui.diagnosis import Finding
from dflash_tui.notify import Notifier, NotifyError
from dflash_tui.targets import Target

ROOT = Path(__file__).resolve().parents[2]
CRASHED_DIR = ROOT / "tests/fixtures/rundirs/main-c119aa7/20261201-031510-tiny-cpu-ca8a"


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip


def sent(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_status_once_of_a_crashed_run_pages_with_the_finding(tmp_path):
    got = tmp_path / "paged.jsonl"
    r = cli("status", "--run-dir", str(CRASHED_DIR), "--notify", f"cat >> {got}")
    assert r.returncode == 2, r.stdout + r.stderr
    (page,) = [p for p in sent(got) if p["finding"]["code"] == "crashed"]
    assert page["event"] == "raised" and page["run_id"] == CRASHED_DIR.name
    assert page["target"] == "local" and page["finding"]["severity"] == "critical"
    assert "InjectedFault" in page["finding"]["evidence"]
    assert {p["event"] for p in sent(got)} == {"raised"}  # nothing cleared in one snapshot


def test_a_live_crash_pages_once_and_the_relaunch_clears_it(tmp_path):
    """Watching with --headless: the run crashes (a real injected fault), the operator
    relaunches, the new run trains: one `raised`, then one `cleared`, nothing repeated."""
    remote = str(tmp_path / "remote")
    where = ["local", "--remote-dir", remote]
    got = tmp_path / "paged.jsonl"
    assert cli("deploy", *where).returncode == 0
    r = cli("launch", *where, "--config", str(TINY), "--set", NO_WANDB,
            env={"DFLASH_FAULT": "drafter:2"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    crashed_id = r.stdout.split()[1]
    watch = subprocess.Popen(
        [sys.executable, "-m", "dflash_tui", *where, "--headless", "--interval", "0.5",
         "--notify", f"cat >> {got}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not any(p["event"] == "raised" for p in sent(got)):
            assert time.monotonic() < deadline, "no page for the crash"
            time.sleep(0.3)
        while True:  # the crashed process may still be on its way out: refused till then
            r = cli("launch", *where, "--config", str(TINY), "--set", NO_WANDB,
                    "--set", "train.max_steps=100000")  # fmt: skip
            if r.returncode == 0 or "is alive" not in r.stderr:
                break
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.5)
        assert r.returncode == 0, r.stderr
        while not any(p["event"] == "cleared" for p in sent(got)):
            assert time.monotonic() < deadline + 90, f"never cleared: {sent(got)}"
            time.sleep(0.3)
        time.sleep(2)  # a few more refreshes: nothing more may be sent
    finally:
        watch.terminate()
        watch.wait(timeout=20)
        cli("kill", *where)
    pages = sent(got)
    assert [(p["event"], p["run_id"]) for p in pages] == [
        ("raised", crashed_id), ("cleared", crashed_id)
    ], pages  # fmt: skip
    assert pages[0]["finding"]["code"] == pages[1]["finding"]["code"]
    assert "Traceback" not in watch.stderr.read()


def test_the_tui_pages_too(tmp_path):
    """The TUI under Pilot, fed the recorded SIGKILL scenario (a real run killed -9): its
    criticals page (`killed`, and the heartbeat that stopped with it)."""
    got = tmp_path / "paged.jsonl"

    async def go() -> None:
        app = DFlashApp(
            Target(name="cpu-box", kind="ssh", host="cpu-box"), theme_name="dark",
            connect=False, clock=lambda: NOW, notify_command=f"cat >> {got}",
        )  # fmt: skip
        async with app.run_test(size=(160, 48)) as pilot:
            for e in events("recorded/killed_sigkill.jsonl"):
                app.feed(typed_event(e))
            for _ in range(100):
                await pilot.pause(0.1)
                if sent(got):
                    break

    asyncio.run(go())
    pages = sent(got)
    assert pages and {p["event"] for p in pages} == {"raised"}, pages
    assert all(p["target"] == "cpu-box" and p["finding"]["severity"] == "critical" for p in pages)
    assert "killed" in [p["finding"]["code"] for p in pages]


def finding(code: str, severity: str = "critical") -> Finding:
    return Finding(severity, code, f"title of {code}", "evidence", "action")


def test_a_failing_command_is_said_once_with_its_exit_code_and_stderr():
    said: list[str] = []
    n = Notifier("echo 'no route to pager' >&2; exit 3", "box", said.append)
    n.update([finding("stalled_loop")], "run-1")
    n.update([], "run-1")  # cleared: a second failure, not said again
    n.close()
    command = "echo 'no route to pager' >&2; exit 3"
    assert said == [f"--notify: {command!r} exited 3: no route to pager"]
    assert [p["event"] for p in n.sent] == ["raised", "cleared"]


def test_warnings_do_not_page_and_a_critical_that_stays_pages_once(tmp_path):
    got = tmp_path / "paged.jsonl"
    n = Notifier(f"cat >> {got}", "box", pytest.fail)
    n.update([finding("slow_throughput", "warning")], "r")
    n.update([finding("stalled_loop"), finding("slow_throughput", "warning")], "r")
    n.update([finding("stalled_loop")], "r")
    n.close()
    assert [(p["event"], p["finding"]["code"]) for p in sent(got)] == [("raised", "stalled_loop")]


def test_a_command_that_hangs_is_killed_after_its_timeout():
    said: list[str] = []
    n = Notifier("sleep 30", "box", said.append, timeout_s=0.3)
    n.update([finding("crashed")], "r")
    time.sleep(0.5)
    n.update([finding("crashed")], "r")
    assert said == ["--notify: 'sleep 30' ran past 0s: killed"]


def test_an_empty_command_is_bad_input():
    with pytest.raises(NotifyError):
        Notifier("  ", "box", print)
    r = cli("status", "--run-dir", str(CRASHED_DIR), "--notify", "")
    assert r.returncode == 2 and r.stderr == "dflash-tui: --notify: the command is empty\n"
