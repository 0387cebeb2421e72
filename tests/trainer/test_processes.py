"""processes mode (runtime.mode = "processes") on real torchrun jobs: gloo on CPU, the tiny
config's 2 targets + 2 drafters as 4 ranks. The same trajectory as threads mode, a failed
rank named in the run dir with the job over in seconds, and the world size refused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.contract.heartbeat import parse_heartbeat
from trainer.contract.ranks import (
    RankHeartbeat,
    parse_rank_heartbeat,
    read_rank_heartbeat,
)
from trainer.contract.typed import Unreadable

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
PROCESSES = ("--set", "runtime.mode=processes")
QUIET = ("--set", "runtime.wandb_mode=disabled", "--set", "train.log_every=1")
# The loss and its sums are all-reduced in float64 and the gradients summed by gloo (a + b
# for two ranks, as threads mode's replica 0 adds replica 1's): on CPU the two modes agree
# to the last bit here; the bound allows a reordered sum (more ranks, another gloo).
REL_TOLERANCE = 1e-5


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a job of this checkout runs in (shared with test_replica_sync)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **(extra or {})}


def torchrun(
    root: Path, *args: str, nproc: int = 4, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A real torchrun job of the trainer, in its own session (so the test can tell
    whether anything of it is left), its output in root/torchrun.out."""
    root.mkdir(parents=True, exist_ok=True)
    out = open(root / "torchrun.out", "wb")  # noqa: SIM115
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "-m", "trainer", "--config", str(TINY)]
    cmd += ["--run-root", str(root / "runs"), *PROCESSES, *QUIET, *args]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=job_env(env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def threads_run(root: Path, *args: str) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True, exist_ok=True)
    out = open(root / "trainer.out", "wb")  # noqa: SIM115
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(root)]
    return subprocess.Popen([*cmd, *QUIET, *args], cwd=ROOT, env=job_env(), stdout=out, stderr=out)


def session_alive(p: subprocess.Popen[bytes]) -> list[str]:
    """The processes of the job's session still running (torchrun and its ranks)."""
    r = subprocess.run(["pgrep", "-s", str(p.pid)], capture_output=True, text=True)
    return r.stdout.split()


def kill_session(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def the_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def test_four_ranks_train_the_same_trajectory_as_four_threads(tmp_path, tiny_target_dir):
    steps = ("--max-steps", "12")
    job = torchrun(tmp_path / "processes", *steps)
    ref = threads_run(tmp_path / "threads", *steps)  # side by side: the same machine
    try:
        assert job.wait(timeout=240) == 0, (tmp_path / "processes" / "torchrun.out").read_text()
        assert ref.wait(timeout=240) == 0, (tmp_path / "threads" / "trainer.out").read_text()
    finally:
        kill_session(job)
        ref.kill()
    run_dir = the_run_dir(tmp_path / "processes" / "runs")
    got, expected = metrics(run_dir), metrics(the_run_dir(tmp_path / "threads"))
    assert [m["step"] for m in got] == list(range(1, 13))
    assert got[-1]["loss"] < 0.5 * got[0]["loss"], (got[0], got[-1])  # it learns
    for m, e in zip(got, expected, strict=True):
        assert m["loss"] == pytest.approx(e["loss"], rel=REL_TOLERANCE), m["step"]
        assert m["grad_norm"] == pytest.approx(e["grad_norm"], rel=REL_TOLERANCE), m["step"]
        assert m["tokens"] == e["tokens"] and m["acc"] == pytest.approx(e["acc"], rel=1e-5)

    # One run dir for the job: the writer's files, every rank's heartbeat.
    hb = parse_heartbeat(json.loads((run_dir / "heartbeat.json").read_text()))
    assert not isinstance(hb, Unreadable)
    assert hb.phase == "finished" and hb.step == 12 and hb.failed_rank is None
    assert len(hb.queues.q_pre) == 2 and len(hb.queues.q_hs) == 2
    assert (run_dir / "checkpoints" / "step-00000012.pt").is_file()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run"]["ranks"] == {
        "world_size": 4,
        "targets": 2,
        "drafters": 2,
        "writer": 2,
        "backend": "gloo",
    }
    ranks = [read_rank_heartbeat(run_dir, r) for r in range(4)]
    assert all(isinstance(b, RankHeartbeat) for b in ranks), ranks
    beats = [b for b in ranks if isinstance(b, RankHeartbeat)]
    assert [(b.rank, b.role, b.index, b.device) for b in beats] == [
        (0, "target", 0, "cpu"),
        (1, "target", 1, "cpu"),
        (2, "drafter", 0, "cpu"),
        (3, "drafter", 1, "cpu"),
    ]
    assert [b.writer for b in beats] == [False, False, True, False]
    assert all(b.phase == "finished" and b.exit_code == 0 and b.error is None for b in beats)
    assert {b.step for b in beats} == {12}
    assert len({b.pid for b in beats}) == 4  # four processes
    # Each target rank reports its own q_pre and its sends in flight to each drafter.
    assert [len(b.queues.q_hs) for b in beats[:2]] == [2, 2]
    assert all(d.capacity == 4 for b in beats[:2] for d in b.queues.q_hs)
    # The rank heartbeat's versioning: a newer schema is read leniently, a foreign role not.
    raw = json.loads((run_dir / "heartbeat-rank0.json").read_text())
    newer = parse_rank_heartbeat({**raw, "schema": 99, "new_field": 1})
    assert isinstance(newer, RankHeartbeat) and newer.rank == 0
    assert isinstance(parse_rank_heartbeat({**raw, "role": "oracle"}), Unreadable)
    # The other drafter logs the same numbers into its own folder (all-reduced).
    twin = metrics(run_dir / "ranks" / "rank-3")
    assert [m["loss"] for m in twin] == [m["loss"] for m in got]


def _wait_rank_step(run_dir_root: Path, rank: int, step: int, p: subprocess.Popen[bytes]):
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert p.poll() is None, "the job ended before the fault"
        for path in run_dir_root.glob(f"*/heartbeat-rank{rank}.json"):
            beat = read_rank_heartbeat(path.parent, rank)
            if isinstance(beat, RankHeartbeat) and beat.step >= step:
                return path.parent, beat
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never reached step {step}")


@pytest.mark.serial  # a time bound: not beside another test's trainer
@pytest.mark.parametrize(
    ("rank", "fault", "said"),
    [
        (1, "", "rank 1 (target 1 on cpu): its process"),  # SIGKILLed by the test
        (3, "drafter-1:4", "rank 3 (drafter 1 on cpu): InjectedFault: injected fault"),
    ],
)
def test_a_failed_rank_ends_the_job_within_seconds_and_is_named(
    tmp_path, tiny_target_dir, rank, fault, said
):
    env = {"DFLASH_FAULT": fault} if fault else None
    job = torchrun(tmp_path, "--max-steps", "100000", env=env)
    try:
        if fault:  # the rank raises on its own at its 5th batch
            run_dir = None
            t0 = None
            job.wait(timeout=200)
        else:
            run_dir, beat = _wait_rank_step(tmp_path / "runs", rank, 3, job)
            t0 = time.monotonic()
            os.kill(beat.pid, signal.SIGKILL)
            job.wait(timeout=30)
        ended = time.time()
        if t0 is not None:
            assert time.monotonic() - t0 < 10, "the job outlived its killed rank by 10 s"
        assert job.returncode != 0
        assert session_alive(job) == [], "a rank outlived the job"
    finally:
        kill_session(job)
    run_dir = run_dir or the_run_dir(tmp_path / "runs")
    hb = parse_heartbeat(json.loads((run_dir / "heartbeat.json").read_text()))
    assert not isinstance(hb, Unreadable)
    assert hb.phase == "crashed" and hb.exit_code == 1
    assert hb.failed_rank == rank
    assert hb.error is not None and said in hb.error.message, hb.error
    assert said in (run_dir / "train.log").read_text()
    for r in range(4):
        b = read_rank_heartbeat(run_dir, r)
        assert isinstance(b, RankHeartbeat), (r, b)
        if r == rank and not fault:  # killed: no last word, its heartbeat just stops
            assert not b.final and b.error is None
        else:
            assert b.phase == "crashed" and b.failed_rank == rank, (r, b)
    if fault:
        own = read_rank_heartbeat(run_dir, rank)
        assert isinstance(own, RankHeartbeat) and own.error is not None
        assert "InjectedFault" in own.error.traceback
        # Its last heartbeat is written as it leaves: the job was over within seconds.
        assert ended - own.now < 10, ended - own.now


def one_trainer_line(stderr: str) -> str:
    """The trainer's one line of bad input, no traceback (shared with test_replica_sync)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_processes_mode_without_torchrun_becomes_torchrun_and_says_bad_input_in_one_line(
    tmp_path,
):
    """Started without torchrun (as `dflash-tui launch` starts it: that path is
    tests/monitor/test_processes_launch.py), the trainer builds a builtin target once and execs
    torchrun; a builtin it cannot build is one line, exit 2, before any rank or run dir."""
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), *PROCESSES]
    cmd += ["--set", "target.path=builtin:no-such-target"]
    env = {k: v for k, v in job_env().items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    r = subprocess.run(
        [*cmd, "--run-root", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert r.returncode == 2, r.stderr
    line = one_trainer_line(r.stderr)
    assert line.startswith("error: target.path: unknown builtin 'builtin:no-such-target'"), line
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # refused before any run dir


def test_a_world_size_that_is_not_the_roles_is_one_line_exit_2(tmp_path):
    """What torchrun --nproc-per-node 3 sets for each of its ranks, refused before any
    rendezvous (so no rank waits for a peer that will never come)."""
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), *PROCESSES]
    for rank in ("0", "2"):
        env = job_env({"WORLD_SIZE": "3", "RANK": rank, "LOCAL_RANK": rank})
        r = subprocess.run(
            [*cmd, "--run-root", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
        assert r.returncode == 2
        if rank == "0":  # one line for the job: rank 0 says it, the others only exit 2
            line = one_trainer_line(r.stderr)
            assert line == (
                'error: config: runtime.mode = "processes": WORLD_SIZE is 3 but'
                " runtime.targets + runtime.drafters make 4 ranks (2 + 2); start torchrun"
                " with --nproc-per-node 4"
            )
        else:
            assert r.stderr.strip() == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("runtime.mode=thread", 'runtime.mode = "thread": expected one of threads, processes'),
        ("runtime.collective_timeout_s=0", "runtime.collective_timeout_s = 0: must be in"),
    ],
)
def test_the_mode_keys_have_rules(override, said):
    from trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert said in str(e.value)


@pytest.mark.parametrize(
    ("devices", "shared"),
    [
        (["cuda:0", "cuda:0"], True),  # one H200, both roles: NCCL would refuse it
        (["0", "cuda:0"], True),
        (["cuda", "cuda:0"], True),
        (["cuda:0", "cuda:1"], False),
        (["auto", "auto"], False),  # one GPU per local rank
        (["cpu", "cpu"], False),
    ],
)
def test_ranks_that_share_a_gpu_are_seen_so_nccl_is_not_chosen_for_them(devices, shared):
    from trainer.distributed.layout import shares_a_gpu

    assert shares_a_gpu(devices) is shared


def test_a_threads_checkpoint_resumed_by_three_ranks_continues_the_same_trajectory(
    tmp_path, tiny_target_dir
):
    """Checkpoints do not depend on the layout: a threads run's (2 targets, 2 replicas)
    continues under torchrun with 1 target rank and 2 drafter ranks. The routing gives each
    step the same batches whatever T is, so the losses are the uninterrupted run's."""
    ref = threads_run(tmp_path / "ref", "--max-steps", "10")
    cut = threads_run(tmp_path / "cut", "--max-steps", "5")
    try:
        assert ref.wait(timeout=240) == 0, (tmp_path / "ref" / "trainer.out").read_text()
        assert cut.wait(timeout=240) == 0, (tmp_path / "cut" / "trainer.out").read_text()
    finally:
        ref.kill()
        cut.kill()
    parent = the_run_dir(tmp_path / "cut")
    job = torchrun(
        tmp_path / "resumed",
        "--resume",
        str(parent),
        "--set",
        'runtime.targets=["cpu"]',
        "--max-steps",
        "10",
        nproc=3,
    )
    try:
        assert job.wait(timeout=240) == 0, (tmp_path / "resumed" / "torchrun.out").read_text()
    finally:
        kill_session(job)
    run_dir = the_run_dir(tmp_path / "resumed" / "runs")
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run"]["parent"] == str(parent.resolve())
    assert config["run"]["ranks"]["world_size"] == 3
    assert "resumed from" in (run_dir / "train.log").read_text()
    expected = {m["step"]: m for m in metrics(the_run_dir(tmp_path / "ref"))}
    got = metrics(run_dir)
    assert [m["step"] for m in got] == [6, 7, 8, 9, 10]
    for m in got:
        assert m["loss"] == pytest.approx(expected[m["step"]]["loss"], rel=REL_TOLERANCE)
        assert m["tokens"] == expected[m["step"]]["tokens"]


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_sigterm_to_torchrun_stops_every_rank_at_one_step_with_a_checkpoint(
    tmp_path, tiny_target_dir
):
    """torchrun passes the SIGTERM to every rank: the drafters agree on the step (the stop
    flag rides the step's all_reduce), the writer checkpoints it, and the targets end
    cleanly when the drafters leave. torchrun itself exits 1 on a signal, as it does."""
    job = torchrun(tmp_path, "--max-steps", "100000")
    try:
        run_dir, _ = _wait_rank_step(tmp_path / "runs", 2, 3, job)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
        assert session_alive(job) == []
    finally:
        kill_session(job)
    hb = parse_heartbeat(json.loads((run_dir / "heartbeat.json").read_text()))
    assert not isinstance(hb, Unreadable)
    assert hb.phase == "stopped" and hb.exit_code == 0 and hb.failed_rank is None
    assert (run_dir / "checkpoints" / f"step-{hb.step:08d}.pt").is_file()
    beats = [read_rank_heartbeat(run_dir, r) for r in range(4)]
    for b in beats:
        assert isinstance(b, RankHeartbeat) and b.phase == "stopped" and b.exit_code == 0, b
        assert b.error is None
    drafters = [b for b in beats if isinstance(b, RankHeartbeat) and b.role == "drafter"]
    assert {b.step for b in drafters} == {hb.step}


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_ranks_whose_launcher_is_killed_stop_at_one_step_instead_of_living_on(
    tmp_path, tiny_target_dir
):
    """torchrun SIGKILLed (the OOM killer, a kill -9, a signal it has no handler for): its
    ranks see their parent gone (trainer/distributed/launcher_watch.py) and stop as at a SIGTERM,
    with the writer's checkpoint, rather than train on as orphans nobody reaps."""
    job = torchrun(tmp_path, "--max-steps", "100000")
    try:
        run_dir, _ = _wait_rank_step(tmp_path / "runs", 2, 3, job)
        pids = [
            b.pid
            for r in range(4)
            if isinstance(b := read_rank_heartbeat(run_dir, r), RankHeartbeat)
        ]
        assert len(pids) == 4
        job.kill()  # torchrun alone: its ranks are not signalled
        job.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in pids if Path(f"/proc/{p}").exists()]
        assert left == [], (tmp_path / "torchrun.out").read_text()[-3000:]
    finally:
        kill_session(job)
    hb = parse_heartbeat(json.loads((run_dir / "heartbeat.json").read_text()))
    assert not isinstance(hb, Unreadable)
    assert hb.phase == "stopped" and hb.exit_code == 0, hb
    assert (run_dir / "checkpoints" / f"step-{hb.step:08d}.pt").is_file()
    assert "the launcher (torchrun, pid" in (run_dir / "train.log").read_text()
