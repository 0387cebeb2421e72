"""The thread/process table's parts without a trainer: the agent's sample of a real process
group on this machine, the monitor's boundary dropping what no /proc could say, and the
rows and meters from a recorded heartbeat and host sample. The live run is in
test_thread_table_live.py."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflash_tui import thread_table
from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.proc_table import ProcTable, signal_member
from dflash_tui.agent.procs import group_pids
from dflash_tui.agent.runs import RunRoot
from dflash_tui.state import Store
from trainer.contract.heartbeat import parse_heartbeat
from trainer.contract.protocol import (
    MAX_PROCS,
    HostSample,
    ProcsEvent,
    decode_event,
    decode_event_line,
)
from trainer.contract.typed import Unreadable

HEARTBEATS = Path(__file__).resolve().parents[1] / "fixtures" / "heartbeats"
RUNDIRS = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "h200-schema2"
ENDED_RUN = "20261201-052645-tiny-gpu-2735"


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A process group of three: a shell leading it, two sleeps it started."""
    p = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 61; wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(group_pids(p.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield p
    os.killpg(p.pid, 9)
    p.wait()


def sampled(group: subprocess.Popen[bytes], tmp_path: Path, twice: bool = True) -> dict[str, Any]:
    """A procs event of the group as the agent sends it (JSON), the second sample's (CPU use
    needs an interval)."""
    table = ProcTable(RunRoot(str(tmp_path)))
    procs = table.read_group(group.pid, group_pids(group.pid))
    if twice:
        time.sleep(0.2)
        procs = table.read_group(group.pid, group_pids(group.pid))
    event = ProcsEvent(t=time.time(), run_id="r1", pgid=group.pid, leader=group.pid, procs=procs)
    return json.loads(json.dumps(event.to_json()))


def test_the_agent_reads_a_real_group(group: subprocess.Popen[bytes], tmp_path: Path) -> None:
    table = ProcTable(RunRoot(str(tmp_path)))
    first = table.read_group(group.pid, group_pids(group.pid))
    assert all(p.cpu_pct is None for p in first)  # no interval yet
    event = decode_event(sampled(group, tmp_path))
    assert isinstance(event, ProcsEvent), event
    by_pid = {p.pid: p for p in event.procs}
    assert set(by_pid) == set(group_pids(group.pid)) and len(by_pid) == 3
    leader = by_pid[group.pid]
    assert leader.name.startswith("sh -c sleep 60") and leader.ppid == os.getpid()
    sleeps = sorted(p.name for p in event.procs if p.pid != group.pid)
    assert sleeps == ["sleep 60", "sleep 61"]
    for p in event.procs:
        assert p.rss > 0 and p.threads == 1 and p.state == "S"
        assert p.cpu_pct is not None and 0.0 <= p.cpu_pct < 50.0
        # the start time is /proc's own: what a signal is checked against
        stat = Path(f"/proc/{p.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        assert p.start == int(stat[19])
    # a pid that has left (or never was in) the group is not read
    assert table.read_group(group.pid, [os.getpid()]) == []


def test_hostile_procs_entries_are_dropped_at_the_boundary(
    group: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    real = sampled(group, tmp_path)
    good = real["procs"][0]
    hostile = [
        {**good, "pid": 0},
        {**good, "pid": -5},
        {**good, "pid": 1 << 40},
        {**good, "rss": -1},
        {**good, "rss": 1 << 70},
        {**good, "rss": True},
        {**good, "cpu_pct": math.nan},
        {**good, "cpu_pct": math.inf},
        {**good, "cpu_pct": -3.0},
        {**good, "cpu_pct": "99"},
        {**good, "state": "Q"},
        {**good, "state": "\x1b[2J"},
        {**good, "name": "x" * 1000},
        {**good, "start": -1},
        {**good, "threads": -1},
        {k: v for k, v in good.items() if k != "pid"},
        "not a process",
        None,
    ]
    event = decode_event({**real, "procs": [*hostile, good]})
    assert isinstance(event, ProcsEvent), event
    assert [p.pid for p in event.procs] == [good["pid"]]  # only the sound one is left
    for bad in hostile:  # the wrapper's entry too: dropped, the group's processes kept
        got = decode_event({**real, "wrapper": bad})
        assert isinstance(got, ProcsEvent) and got.wrapper is None and got.procs, bad
    kept = decode_event({**real, "wrapper": good})
    assert isinstance(kept, ProcsEvent) and kept.wrapper is not None
    # NaN as JSON text (Python's json writes and reads it) is dropped the same way
    line = json.dumps({**real, "procs": [{**good, "cpu_pct": math.nan}]})
    got = decode_event_line(line)
    assert isinstance(got, ProcsEvent) and got.procs == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"procs": [{"pid": 2, "start": 1}] * (MAX_PROCS + 1)}, "processes (at most"),
        ({"pgid": -1}, "not a process group"),
        ({"leader": 1 << 40}, "not a process group"),
        ({"t": math.nan}, "not a time"),
        ({"procs": {"pid": 2}}, "procs: expected a list"),
    ],
)
def test_an_unsound_procs_event_is_refused_whole(
    group: subprocess.Popen[bytes], tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    got = decode_event({**sampled(group, tmp_path, twice=False), **change})
    assert isinstance(got, Unreadable) and why in got.why, got


def test_an_ended_run_lists_no_process_and_says_why(tmp_path: Path) -> None:
    """A run dir recorded from a real run that has ended: whatever has its pid now is not
    listed (nor signalled)."""
    shutil.copytree(RUNDIRS / ENDED_RUN, tmp_path / ENDED_RUN)
    event = ProcTable(RunRoot(str(tmp_path))).sample(ENDED_RUN)
    assert (event.pgid, event.leader, event.procs) == (0, 0, [])
    assert event.note.startswith(f"run {ENDED_RUN} ended ") and "not signalled" not in event.note
    with pytest.raises(CommandError, match=f"run {ENDED_RUN} ended .*: not signalled"):
        signal_member(RunRoot(str(tmp_path)), ENDED_RUN, os.getpid(), 0, "SIGTERM")


def recorded_store() -> Store:
    """A store holding a heartbeat of a real CPU run (tests/fixtures/heartbeats)."""
    data = json.loads((HEARTBEATS / "training-cpu.json").read_text())
    hb = parse_heartbeat(data)
    assert not isinstance(hb, Unreadable)
    s = Store("local", clock=lambda: hb.now)
    s.heartbeat = hb
    s.run_id = hb.run_id
    return s


def test_thread_rows_from_a_real_heartbeat() -> None:
    s = recorded_store()
    rows = {r.name: r for r in thread_table.thread_rows(s)}
    order = [r.name for r in thread_table.thread_rows(s)]
    # the pipeline first, upstream first, then the trainer's other threads by name
    assert order[:6] == [
        "prefetch-0",
        "prefetch-1",
        "target-0",
        "target-1",
        "drafter-0",
        "drafter-1",
    ]
    assert set(order[6:]) == {"MainThread", "gil-probe", "heartbeat"}
    # a thread blocked on a queue names it and why, from its state
    assert rows["prefetch-0"].waits_on == "q_pre (full)"
    assert rows["target-1"].waits_on == "q_hs (full)"
    # a thread at work names the queue its loop waits on most, with the share
    t0 = rows["target-0"]
    assert t0.state == "forward" and t0.waits_on == "q_hs 21%"  # 100.6 of 479.1 ms
    assert t0.slowest is not None and t0.slowest.name == "forward"
    assert t0.period_ms is not None and abs(t0.period_ms - 479.084) < 0.01
    assert t0.cpu_pct == 38.6 and t0.role == "target" and t0.device == "cpu"
    d0 = rows["drafter-0"]
    assert d0.slowest is not None and d0.slowest.name == "backward" and d0.waits_on == ""
    assert thread_table.waits_on("waiting for replicas", None) == "replicas (barrier)"
    assert rows["MainThread"].slowest is None and rows["MainThread"].period_ms is None
    threads, _ = thread_table.by_cpu(list(rows.values()), [])
    assert [r.name for r in threads[:2]] == ["drafter-0", "drafter-1"]  # 56.5 %, 51.5 %


def test_the_meters_say_the_hosts_figures() -> None:
    h = HostSample(
        cpus=2, load=[3.0, 2.5, 2.0], cpu_pct=75.0, mem_total=8 << 30, mem_available=2 << 30
    )
    cpu, ram, load = thread_table.meters(h, width=8)
    assert cpu == "CPU  [██████  ]  75.0% of 2 CPUs"
    assert ram == "RAM  [██████  ] 6.0 GB used of 8.0 GB"
    assert load == "load [████████] 3.00 2.50 2.00  (1.50 per CPU)"
    assert "no sample" in thread_table.meters(None)[0]


def test_one_threads_section_of_a_named_and_of_a_faulthandler_dump() -> None:
    named = (
        "# 3 threads at 2026-12-02 16:00:00\n\n"
        'Thread "drafter-0" role=drafter native_id=11\n  File "a.py", line 1, in step\n\n'
        'Thread "drafter-1" role=drafter native_id=12\n  File "b.py", line 2, in wait\n\n'
        "# faulthandler\nThread 0x00007f01 (most recent call first):\n  File a.py\n"
    )
    got = thread_table.thread_section(named, "drafter-0")
    assert got == 'Thread "drafter-0" role=drafter native_id=11\n  File "a.py", line 1, in step'
    assert thread_table.thread_section(named, "drafter") is None  # a name, not a prefix
    fh = (
        'Thread 0x00007f01 "target-0" role=target@cpu (forward) (most recent call first):\n'
        '  File "t.py", line 3 in forward\n\n'
        'Current thread 0x00007f02 "MainThread" role=main@cpu (supervising) (most recent'
        ' call first):\n  File "m.py", line 9 in supervise\n'
    )
    section = thread_table.thread_section(fh, "MainThread")
    assert section is not None and section.startswith("Current thread 0x00007f02")
    assert "supervise" in section and "forward" not in section


def test_the_screen_shows_hostile_names_as_text(
    group: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process name (its command line is anyone's to choose) and a thread name reach the
    table as visible text: markup is not read, escapes are shown as `\\x1b`."""
    import asyncio

    from textual.widgets import DataTable

    from dflash_tui.app import DFlashApp
    from dflash_tui.targets import Target
    from dflash_tui.widgets.thread_table import ThreadsScreen

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    s = recorded_store()
    real = sampled(group, tmp_path)
    evil = "[bold red]boom\x1b[2J\u202e"
    real["procs"][0]["name"] = evil
    real["run_id"] = s.run_id
    event = decode_event(real)
    assert isinstance(event, ProcsEvent) and event.procs[0].name == evil

    async def go() -> list[str]:
        app = DFlashApp(Target(name="local", kind="local"), connect=False, clock=s.clock)
        async with app.run_test(size=(200, 40)) as pilot:
            app.store.heartbeat, app.store.run_id = s.heartbeat, s.run_id
            app.store.apply(event)
            await pilot.press("T")
            await pilot.pause(0.3)
            assert isinstance(app.screen, ThreadsScreen)
            table = app.screen.query_one(DataTable)
            return [str(c) for key in list(table.rows) for c in table.get_row(key)]

    shown = asyncio.run(go())
    named = [c for c in shown if "boom" in c]
    assert named == [f"{event.procs[0].pid} [bold red]boom\\x1b[2J\\u202e"], named
    assert "drafter-0" in shown and "q_pre (full)" in shown
