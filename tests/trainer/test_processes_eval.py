"""Held-out τ in processes mode (trainer/distributed/eval_rank.py) on real torchrun jobs (gloo
on CPU, 2 target ranks + 2 drafter ranks): target 0's rank decodes with the weights the
writer sends it, and gives threads mode's numbers, in threads mode's places, for the
monitor to read; an eval the layout cannot run is refused before any rendezvous."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_processes import (
    TINY,
    kill_session,
    metrics,
    session_alive,
    the_run_dir,
    threads_run,
    torchrun,
)

from trainer.contract.heartbeat import Heartbeat, read_heartbeat

ROOT = Path(__file__).resolve().parents[2]
# The tiny target that has learned to chat and its own answers as data (as
# test_online_eval.py): a drafter's τ against it moves with training, so an eval that
# decoded with other weights than the step's would show.
CHAT = (
    "--set", "target.path=builtin:tiny-qwen3-chat",
    "--set", "data.path=builtin:tiny-chat-answers",
)  # fmt: skip
EVAL = (
    "--set", "data.held_out=16", "--set", "eval.every=30", "--set", "eval.prompts=3",
    "--set", "eval.new_tokens=24", "--set", "eval.tree_nodes=16",
    "--set", "train.checkpoint_every=30", "--max-steps", "60",
)  # fmt: skip
STEPS = (30, 60)
UTF8 = {"PYTHONIOENCODING": "utf-8"}


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}


def eval_record(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "eval" / f"step-{step:08d}.json").read_text())


@pytest.fixture(scope="module")
def both_modes(tmp_path_factory, dflash_cache_dir) -> tuple[Path, Path]:
    """The same config, seed and steps as a 4-rank torchrun job and as a threads run,
    side by side: (the job's run dir, the threads run's)."""
    from trainer.builtins.resolve import resolve_data_path, resolve_target_path

    # Into this session's cache once, from the checkout's prebuilt/ (test_online_eval.py's
    # fixture builds them instead, and tests that build), before two runs ask at once.
    resolve_target_path("builtin:tiny-qwen3-chat")
    resolve_data_path("builtin:tiny-chat-answers")
    root = tmp_path_factory.mktemp("proceval")
    job = torchrun(root / "processes", *CHAT, *EVAL)
    ref = threads_run(root / "threads", *CHAT, *EVAL)
    try:
        assert job.wait(timeout=400) == 0, (root / "processes" / "torchrun.out").read_text()
        assert ref.wait(timeout=400) == 0, (root / "threads" / "trainer.out").read_text()
    finally:
        kill_session(job)
        ref.kill()
    return the_run_dir(root / "processes" / "runs"), the_run_dir(root / "threads")


@pytest.mark.serial  # two trainers of five processes on two cores: not beside more
@pytest.mark.timeout(900)  # both runs side by side: ~1.5 min alone on 2 cores, far more loaded
def test_processes_mode_measures_threads_modes_tau_step_for_step(both_modes):
    job, threads = both_modes
    for step in STEPS:
        got, want = eval_record(job, step), eval_record(threads, step)
        for key in ("tau", "per_position", "verify_steps", "tokens", "prompts", "device"):
            assert got[key] == want[key], (step, key, got[key], want[key])
        assert got["during_training"] and got["run_id"] == job.name
        # DDTree beside the chain, on the same rank and prompts: its numbers too.
        for key in ("tau", "per_position", "verify_steps", "tokens", "nodes"):
            assert got["tree"][key] == want["tree"][key], (step, "tree", key)
    # The weights sent were the step's: the drafter learned, so τ rose.
    assert eval_record(job, 60)["tau"] > eval_record(job, 30)["tau"] > 1.0

    # The job's heartbeat and train.log (the writer's) say it as threads mode's do.
    hb, ref = read_heartbeat(job / "heartbeat.json"), read_heartbeat(threads / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and isinstance(ref, Heartbeat)
    assert hb.eval is not None and ref.eval is not None
    assert [(p.step, p.tau) for p in hb.eval.history] == [
        (s, eval_record(job, s)["tau"]) for s in STEPS
    ]
    assert [(p.step, p.tau, p.tree_tau) for p in hb.eval.history] == [
        (p.step, p.tau, p.tree_tau) for p in ref.eval.history
    ]
    assert hb.eval.tree_nodes == 16 and all(p.tree_tau for p in hb.eval.history)
    assert (hb.eval.every, hb.eval.held_out, hb.eval.prompts, hb.eval.new_tokens) == (30, 16, 3, 24)
    assert hb.eval.device == "cpu" and hb.eval.error is None and hb.eval.running_step is None
    assert hb.eval.skipped == 0 and hb.eval.last is not None and hb.eval.last.step == 60
    # What the writer's drafter thread paid: its copy into the send buffer, twice.
    assert 0 < hb.eval.snapshot_s < 1.0
    assert hb.graphs["eval"].off_reason == "the eval runs on cpu, not a CUDA device"
    log = (job / "train.log").read_text()
    tau30 = eval_record(job, 30)["tau"]
    assert f"eval: step 30: held-out τ {tau30:.2f} of 16 over 3 prompts × 24 tokens" in log
    assert "not measured" not in log
    # A metrics row carries an eval that finished before it, the writer's rows as threads
    # mode's: the step-60 one comes after the last row (wandb takes it at the end).
    carried = [(m["eval"]["step"], m["eval"]["tau"]) for m in metrics(job) if m.get("eval")]
    assert carried in ([], [(30, tau30)]), carried
    if eval_record(job, 30)["at"] < metrics(job)[-1]["time"] - 1.0:
        assert carried == [(30, tau30)]

    # The checkpoint of step 30 through `python -m trainer eval` (a whole target loaded
    # apart, the writer's weights from disk): the same acceptance, token for token.
    online = eval_record(job, 30)
    e = subprocess.run(
        [sys.executable, "-m", "trainer", "eval", str(job), "--step", "30",
         "--prompts", "3", "--new-tokens", "24"],
        capture_output=True, text=True, timeout=240, env=trainer_env(), cwd=ROOT,
    )  # fmt: skip
    assert e.returncode == 0, e.stderr
    offline = eval_record(job, 30)
    for key in ("tau", "per_position", "verify_steps", "tokens"):
        assert offline[key] == online[key], key


# Serial: it reads both_modes, which the serial test above builds alone; in the parallel
# phase each xdist worker that ran a reader built it again beside other tests (111 s each).
@pytest.mark.serial
@pytest.mark.timeout(900)  # both_modes, when this test is the first to ask for it
def test_status_reads_a_processes_jobs_tau_as_a_threads_runs(both_modes):
    """`dflash-tui status` on the job's run root, through the real agent: the τ the
    heartbeat holds, in the line and in --json, as for a threads run."""
    job, _ = both_modes
    where = ["local", "--run-root", str(job.parent)]
    status = [sys.executable, "-m", "dflash_tui", "status", *where]
    run = {"capture_output": True, "text": True, "timeout": 120, "cwd": ROOT}
    snap = json.loads(
        subprocess.run([*status, "--json"], env=trainer_env(), **run).stdout.splitlines()[0]
    )
    hb = json.loads((job / "heartbeat.json").read_text())
    assert snap["state"]["eval"] == hb["eval"]
    assert snap["tau"]["latest"]["tau"] == eval_record(job, 60)["tau"]
    assert snap["tau"]["evals"] == 2 and snap["tau"]["trend"] == "up"
    line = subprocess.run(status, env=trainer_env(UTF8), **run).stdout.splitlines()[0]
    assert f" | τ {eval_record(job, 60)['tau']:.2f}↑ | " in line, line


# Serial: it reads both_modes, which the serial test above builds alone; in the parallel
# phase each xdist worker that ran a reader built it again beside other tests (111 s each).
@pytest.mark.serial
@pytest.mark.timeout(900)  # both_modes, when this test is the first to ask for it
def test_the_tui_shows_a_processes_jobs_tau(both_modes, tmp_path, monkeypatch):
    """The TUI on the job's run root through the real agent: the heartbeat pane's held-out
    row, as dflash_tui/evaluation.py fits it, from the writer's heartbeat."""
    import asyncio

    from dflash_tui import evaluation
    from dflash_tui.app import DFlashApp
    from dflash_tui.targets import resolve_target
    from dflash_tui.widgets.heartbeat import HeartbeatPane

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    job, _ = both_modes
    hb = read_heartbeat(job / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and hb.eval is not None
    tau = evaluation.summary(hb.eval)
    assert tau is not None and tau.latest is not None
    target = resolve_target("local", run_root=str(job.parent), python=sys.executable)

    async def held_out_row() -> str:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=(220, 50)) as pilot:
            for _ in range(300):
                await pilot.pause(0.1)
                pane = app.query_one(HeartbeatPane)
                lines = [
                    "".join(s.text for s in strip)
                    for strip in pane.render_lines(pane.region.reset_offset)
                ]
                if rows := [ln.strip() for ln in lines if "held-out" in ln]:
                    return rows[0]
        raise AssertionError("no held-out row")

    row = asyncio.run(held_out_row())
    assert row in {f"held-out     {form}" for form in tau.forms()}, row
    assert f"τ {eval_record(job, 60)['tau']:.2f}" in row


def test_an_eval_the_layout_cannot_run_is_one_line_exit_2_before_any_rendezvous(tmp_path):
    """Processes mode decodes on target 0's rank: CUDA graphs asked for there on a CPU
    is refused by rank 0 for the job (the others only exit 2), before torch.distributed
    is started (no peer here to meet) and before any run dir or model."""
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(tmp_path)]
    cmd += ["--set", "runtime.mode=processes", "--set", "data.held_out=8"]
    cmd += ["--set", "eval.every=10", "--set", "eval.cuda_graphs=on"]
    for rank in ("0", "2"):
        env = trainer_env({"WORLD_SIZE": "4", "RANK": rank, "LOCAL_RANK": rank})
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})  # nobody: never dialled
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 2, r.stderr
        if rank == "0":
            assert "Traceback" not in r.stderr
            assert r.stderr.strip().splitlines() == [
                'error: config: eval.cuda_graphs = "on": CUDA graphs need a CUDA device, and'
                " processes mode evaluates on target 0's rank (runtime.targets[0] = 'cpu', a"
                " CPU); use 'auto' or 'off'"
            ]
        else:
            assert r.stderr.strip() == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_sigterm_during_an_eval_on_the_eval_rank_stops_the_job_promptly(tmp_path, tiny_target_dir):
    """An eval under way on target 0's rank when torchrun passes a SIGTERM on: it is left
    unfinished there, the writer's link ends, and every rank stops at one step."""
    job = torchrun(
        tmp_path, "--max-steps", "100000", "--set", "data.held_out=8", "--set", "eval.every=5",
        "--set", "eval.prompts=8", "--set", "eval.new_tokens=2000",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        run_dir = None
        while time.monotonic() < deadline:
            assert job.poll() is None, (tmp_path / "torchrun.out").read_text()[-3000:]
            dirs = [p for p in (tmp_path / "runs").glob("*") if (p / "heartbeat.json").is_file()]
            hb = read_heartbeat(dirs[0] / "heartbeat.json") if dirs else None
            if isinstance(hb, Heartbeat) and hb.eval is not None and hb.eval.running_step:
                run_dir = dirs[0]
                break
            time.sleep(0.2)
        assert run_dir is not None, "no eval started"
        t0 = time.monotonic()
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
        assert time.monotonic() - t0 < 30
        assert session_alive(job) == []
    finally:
        kill_session(job)
    hb = read_heartbeat(run_dir / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and hb.phase == "stopped" and hb.exit_code == 0, hb
    assert hb.eval is not None and hb.eval.running_step is None
    own = (run_dir / "ranks" / "rank-0" / "train.log").read_text()
    assert "left unfinished: the run is stopping" in own
    assert "left unfinished: the run is stopping" in (run_dir / "train.log").read_text()
