"""The host sample: the agent's probe on this machine's real /proc, the real agent sending it,
each run's checkpoints in the runs list, and the monitor's boundary refusing what no host
could say (the agent's stream is untrusted: trainer/contract/protocol.py `invalid`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_agent import AgentProcess
from test_diagnosis import NOW, Clock
from test_hostile_input import mutated

from dflash_tui.agent.host import HostProbe, cpu_count, disk_space, meminfo
from dflash_tui.agent.runs import checkpoint_use
from dflash_tui.diagnosis import diagnose
from dflash_tui.headless import host_summary, status_line
from dflash_tui.state import Store
from trainer.contract.checkpoints import CheckpointUse
from trainer.contract.protocol import HostSample, RunsEvent, decode_event, decode_event_line
from trainer.contract.typed import Unreadable

RUNDIRS = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "h200-schema2"
RUN_ID = "20261201-052645-tiny-gpu-2735"


# -- the probe on this machine ------------------------------------------------------------------
def test_the_probe_reads_this_machine(tmp_path: Path) -> None:
    probe = HostProbe(str(tmp_path))
    before = os.getloadavg()
    h = probe.sample()
    after = os.getloadavg()
    assert h.invalid() is None
    assert h.cpus == len(os.sched_getaffinity(0))
    # The kernel's own averages, read around the sample (they move slowly)
    assert len(h.load) == 3
    for got, lo, hi in zip(h.load, before, after, strict=True):
        assert min(lo, hi) - 0.01 <= got <= max(lo, hi) + 0.01
    # MemTotal is the kernel's count of RAM pages, as sysconf gives it
    assert h.mem_total == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert h.mem_available is not None and 0 < h.mem_available <= h.mem_total
    usage = shutil.disk_usage(tmp_path)
    assert h.disk is not None and h.disk.path == str(tmp_path)
    assert h.disk.total == usage.total
    assert abs(h.disk.free - usage.free) < 256 << 20  # other writers between the two reads


def test_host_cpu_use_is_over_the_interval_since_the_last_sample(tmp_path: Path) -> None:
    """One thread spinning for the whole interval keeps at least one of the CPUs busy."""
    probe = HostProbe(str(tmp_path))
    probe.sample()
    stop = time.monotonic() + 1.0

    def spin() -> None:
        while time.monotonic() < stop:
            pass

    t = threading.Thread(target=spin)
    t.start()
    t.join()
    h = probe.sample()
    assert h.cpu_pct is not None
    assert h.cpu_pct >= 0.8 * 100.0 / h.cpus, h


def test_a_run_root_not_made_yet_is_statted_at_the_folder_above(tmp_path: Path) -> None:
    d = disk_space(str(tmp_path / "not" / "yet" / "runs"))
    assert d is not None and d.path == str(tmp_path)


def test_what_a_host_does_not_offer_is_none_not_a_guess() -> None:
    assert meminfo("MemTotal:  8000 kB\nMemFree:  100 kB\n") is None  # a kernel before 3.14
    assert meminfo("MemTotal: 8 kB\nMemAvailable: 4 kB\n") == (8192, 4096)
    assert cpu_count() >= 1


# -- the real agent ----------------------------------------------------------------------------
def wait_for(agent: AgentProcess, kind: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            e = agent.events.get(timeout=0.5)
        except Exception:
            continue
        if e.get("type") == kind:
            return e
    raise AssertionError(f"no {kind} event in {timeout:.0f} s")


def test_the_agent_sends_host_samples_and_each_runs_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(RUNDIRS / RUN_ID, root / RUN_ID)
    agent = AgentProcess(root, tmp_path / "remote", tmp_path, extra=("--host-interval", "0.3"))
    try:
        first = decode_event(wait_for(agent, "host"))
        second = decode_event(wait_for(agent, "host"))
        runs = decode_event(wait_for(agent, "runs"))
    finally:
        agent.proc.kill()
        agent.proc.wait()
    for h in (first, second):
        assert isinstance(h, HostSample), h
        assert h.disk is not None and h.disk.path == str(root)
        assert h.cpus == len(os.sched_getaffinity(0)) and h.cpu_pct is not None
    assert isinstance(first, HostSample) and isinstance(second, HostSample)
    assert 0.2 < second.t - first.t < 5.0
    assert isinstance(runs, RunsEvent)
    (info,) = runs.runs
    pts = sorted((root / RUN_ID / "checkpoints").glob("step-*.pt"))
    config = json.loads((root / RUN_ID / "config.json").read_text())
    assert info.checkpoints == CheckpointUse(
        count=len(pts),
        newest_step=int(pts[-1].stem.split("-")[1]),
        newest_bytes=pts[-1].stat().st_size,
        every=config["train"]["checkpoint_every"],
    )


def test_checkpoint_use_refuses_a_symlinked_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNDIRS / RUN_ID, run)
    pts = sorted((run / "checkpoints").glob("step-*.pt"))
    big = tmp_path / "big"
    big.write_bytes(b"x" * 5000)
    newer = run / "checkpoints" / "step-00099999.pt"
    newer.symlink_to(big)
    use = checkpoint_use(str(run), {"train": {"checkpoint_every": True}})
    assert use is not None
    assert (use.newest_step, use.newest_bytes) == (366, pts[-1].stat().st_size)
    assert use.every is None  # true is no step count
    assert checkpoint_use(str(tmp_path / "nothing"), None) is None


# -- the schedule the disk must hold -----------------------------------------------------------
def trainer_schedule(newest: int, every: int, total: int) -> list[int]:
    """The steps the trainer checkpoints at after `newest`: trainer/runtime/pipeline.py's rule
    (`every and step % every == 0 and not last`) and the final one (trainer/runtime/run.py)."""
    return [s for s in range(newest + 1, total + 1) if (every and s % every == 0) or s == total]


@pytest.mark.parametrize(
    ("newest", "every", "total"),
    [(40, 20, 100), (40, 20, 2000), (366, 100, 5000), (100, 100, 500), (7, 0, 50),
     (50, 20, 50), (60, 20, 50), (13, 7, 70), (0, 1, 5)],
)  # fmt: skip
def test_the_checkpoints_to_come_follow_the_trainers_schedule(
    newest: int, every: int, total: int
) -> None:
    use = CheckpointUse(count=1, newest_step=newest, newest_bytes=1, every=every)
    want = trainer_schedule(newest, every, total)
    assert use.count_to_come(total) == len(want)
    assert [use.step_to_come(k, total) for k in range(1, len(want) + 2)] == [*want, None]


# -- the boundary -------------------------------------------------------------------------------
GOOD: dict[str, Any] = {
    "type": "host", "t": NOW, "cpus": 2, "load": [4.5, 3.0, 2.0], "cpu_pct": 97.0,
    "mem_total": 8 << 30, "mem_available": 3 << 30,
    "disk": {"path": "/workspace/dflash/runs", "free": 40 << 30, "total": 100 << 30},
}  # fmt: skip
HOSTILE = [
    ({"t": float("nan")}, "not a time"),  # an age of NaN would keep it fresh for ever
    ({"cpus": 0}, "cpus 0"),
    ({"cpus": True}, "expected int"),
    ({"cpus": 1 << 40}, "cpus"),
    ({"load": [float("nan"), 1.0, 1.0]}, "load"),
    ({"load": [float("inf"), 1.0, 1.0]}, "load"),
    ({"load": [-1.0, 1.0, 1.0]}, "load"),
    ({"load": [1.0]}, "load"),
    ({"load": "4.5"}, "expected a list"),
    ({"cpu_pct": 150.0}, "cpu_pct"),
    ({"cpu_pct": float("nan")}, "cpu_pct"),
    ({"mem_available": 9 << 30}, "memory"),
    ({"mem_available": -1}, "memory"),
    ({"mem_total": None}, "come together"),
    ({"mem_total": 1 << 62, "mem_available": 1 << 61}, "memory"),
    ({"disk": {"path": "/", "free": 5, "total": 4}}, "disk"),
    ({"disk": {"path": "/", "free": -5, "total": 4}}, "disk"),
    ({"disk": {"path": "/", "free": 1.5, "total": 4}}, "expected int"),
    ({"disk": "full"}, "expected an object"),
]


def host_store() -> Store:
    s = Store("gpu-box", clock=Clock(NOW))
    good = decode_event(GOOD)
    assert isinstance(good, HostSample)
    s.apply(good)
    return s


@pytest.mark.parametrize(("edit", "why"), HOSTILE)
def test_a_host_sample_no_host_could_send_is_refused(edit: dict[str, Any], why: str) -> None:
    got = decode_event({**GOOD, **edit})
    assert isinstance(got, Unreadable) and why in got.why, got
    s = host_store()
    kept = s.host
    s.apply(got)
    assert s.malformed == 1 and s.host is kept  # counted; the last good sample stays


def test_nan_from_the_wire_is_refused_too() -> None:
    """json.loads reads NaN and Infinity: a line the agent never writes."""
    raw = json.dumps({**GOOD, "load": [1.0, 1.0, 1.0]}).replace("[1.0, 1.0", "[NaN, Infinity")
    got = decode_event_line(raw)
    assert isinstance(got, Unreadable) and "load" in got.why


@pytest.mark.parametrize(
    "checkpoints",
    [{"count": 3, "newest_step": 40, "newest_bytes": -1, "every": 20},
     {"count": 0, "newest_step": 40, "newest_bytes": 10, "every": 20},
     {"count": 3, "newest_step": -4, "newest_bytes": 10, "every": 20},
     {"count": 3, "newest_step": 40, "newest_bytes": 10, "every": -20}],
)  # fmt: skip
def test_runs_whose_checkpoints_no_disk_holds_are_refused(checkpoints: dict[str, Any]) -> None:
    runs = {"type": "runs", "t": NOW, "runs": [{"run_id": "r1", "checkpoints": checkpoints}]}
    got = decode_event(runs)
    assert isinstance(got, Unreadable) and got.why.startswith("r1: checkpoints:"), got
    sound = {**checkpoints, "count": 3, "newest_step": 40, "newest_bytes": 10, "every": 20}
    ok = decode_event({**runs, "runs": [{"run_id": "r1", "checkpoints": sound}]})
    assert isinstance(ok, RunsEvent) and ok.runs[0].checkpoints is not None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_mutated_host_sample_is_refused_or_sound_and_no_view_trips(data: Any) -> None:
    raw = data.draw(mutated(GOOD))
    got = decode_event(raw)
    s = host_store()
    s.apply(got)
    if isinstance(got, HostSample):
        assert got.invalid() is None and s.host is got
        assert got.cpus >= 1 and all(0.0 <= x <= 1e6 for x in got.load)
    elif isinstance(got, Unreadable):
        assert s.malformed == 1  # counted, and the good sample kept
        assert s.host is not None and s.host.cpus == 2
    findings = diagnose(s, NOW)
    assert not [f for f in findings if f.code == "rule_error"], findings
    status_line(s, findings)
    host_summary(s)
    json.dumps(s.to_json(NOW))


def test_the_status_line_of_host_context() -> None:
    s = host_store()
    assert host_summary(s) == (
        "host: 2 CPUs, load 4.50 (2.25 per CPU), CPU 97% busy, memory 3.0 GB of 8.0 GB "
        "available, disk 40.0 GB free of 100.0 GB on /workspace/dflash/runs"
    )
    assert s.to_json(NOW)["host"]["load"] == [4.5, 3.0, 2.0]
    assert Store().to_json(NOW)["host"] is None and host_summary(Store()) is None


def test_the_tui_shows_the_host_under_its_gpus_with_a_hostile_path_as_text() -> None:
    from app_scenarios import healthy
    from monitor_helpers import typed_event
    from test_boundary import SIZE, TARGET, plain

    from dflash_tui.app import DFlashApp
    from dflash_tui.widgets.gpus import GpuPane

    hostile = {**GOOD, "disk": {**GOOD["disk"], "path": "/runs\x1b[2J\u202e"}}

    async def go() -> None:
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            await pilot.pause(0.2)
            assert "host:" not in plain(app.query_one(GpuPane))  # no sample, no line
            app.feed(decode_event(hostile))
            await pilot.pause(0.4)
            pane = plain(app.query_one(GpuPane))
            assert "/140G" in pane  # the GPUs still there
            assert "host: 2 CPUs, load 4.50 (2.25 per CPU)" in pane
            assert r"/runs\x1b[2J\u202e" in pane and "\x1b" not in pane

    asyncio.run(go())
