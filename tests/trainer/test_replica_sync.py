"""processes mode's drafter replicas on torch's DDP (trainer/distributed/replica_sync.py), on
real torchrun jobs over gloo: one drafter rank runs no collective (its profile says so), the
bf16 reduce trains beside fp32, a checkpoint of 3 drafter ranks resumes on 2, on 1 and in
threads mode with the same losses, and a reduce setting the layout cannot honour is one line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.test_processes import (
    PROCESSES,
    REL_TOLERANCE,
    ROOT,
    TINY,
    job_env,
    kill_session,
    metrics,
    one_trainer_line,
    the_run_dir,
    threads_run,
    torchrun,
)

ONE_TARGET = ("--set", 'runtime.targets=["cpu"]')
BF16 = ("--set", "runtime.grad_reduce_dtype=bf16")
COLLECTIVES = ("allreduce", "all_reduce", "broadcast", "allgather", "all_gather", "reduce_scatter")


def drafters(n: int) -> tuple[str, str]:
    return ("--set", "runtime.drafters=[" + ",".join(['"cpu"'] * n) + "]")


def trace_names(run_dir: Path) -> set[str]:
    """The names of every event in the run's DFLASH_PROFILE trace."""
    (path,) = (run_dir / "profile").glob("steps-*.json.gz")
    with gzip.open(path, "rt") as f:
        return {str(e.get("name", "")) for e in json.load(f)["traceEvents"]}


def collectives(names: set[str]) -> set[str]:
    return {n for n in names if any(c in n.lower() for c in COLLECTIVES)}


def finish(job: subprocess.Popen[bytes], out: Path) -> None:
    try:
        assert job.wait(timeout=300) == 0, out.read_text()
    finally:
        kill_session(job)


def finish_threads(run: subprocess.Popen[bytes], root: Path) -> None:
    try:
        assert run.wait(timeout=300) == 0, (root / "trainer.out").read_text()
    finally:
        run.kill()


def test_one_drafter_rank_trains_without_a_collective_and_two_all_reduce_in_bf16(
    tmp_path, tiny_target_dir
):
    """The drafter's own profile over steps 4-6: with one drafter rank, its receives from
    the target are there and no collective is; with two, the bucket all-reduces are. And
    the bf16 reduce trains: the losses of fp32's job, not to the bit, but close."""
    profile = {"DFLASH_PROFILE": "3:3"}
    steps = ("--max-steps", "12")
    alone = torchrun(tmp_path / "one", *steps, *ONE_TARGET, *drafters(1), nproc=2, env=profile)
    half = torchrun(tmp_path / "bf16", *steps, *BF16, env=profile)
    finish(alone, tmp_path / "one" / "torchrun.out")
    full = torchrun(tmp_path / "fp32", *steps)
    finish(half, tmp_path / "bf16" / "torchrun.out")
    finish(full, tmp_path / "fp32" / "torchrun.out")

    one = trace_names(the_run_dir(tmp_path / "one" / "runs"))
    assert any("recv" in n for n in one), sorted(one)  # the trace sees this rank's comms
    assert collectives(one) == set(), sorted(collectives(one))
    two = trace_names(the_run_dir(tmp_path / "bf16" / "runs"))
    assert collectives(two), sorted(two)

    got = metrics(the_run_dir(tmp_path / "bf16" / "runs"))
    ref = metrics(the_run_dir(tmp_path / "fp32" / "runs"))
    assert [m["step"] for m in got] == [m["step"] for m in ref] == list(range(1, 13))
    assert got[-1]["loss"] < 0.5 * got[0]["loss"], (got[0], got[-1])  # it learns
    assert [m["loss"] for m in got] != [m["loss"] for m in ref]  # the wire was bf16
    for m, e in zip(got, ref, strict=True):
        assert m["loss"] == pytest.approx(e["loss"], rel=2e-2), m["step"]
        assert m["tokens"] == e["tokens"]


def test_a_checkpoint_of_three_drafter_ranks_resumes_on_two_on_one_and_in_threads_mode(
    tmp_path, tiny_target_dir
):
    """Every drafter rank holds the whole replica and the writer saves it: the checkpoint
    does not know the layout. Resumed on 2 drafter ranks it trains the losses threads mode's
    2 replicas train from it; on 1 drafter rank, those of threads mode's 1 replica."""
    cut = torchrun(tmp_path / "cut", "--max-steps", "5", *ONE_TARGET, *drafters(3), nproc=4)
    finish(cut, tmp_path / "cut" / "torchrun.out")
    parent = the_run_dir(tmp_path / "cut" / "runs")
    assert (parent / "checkpoints" / "step-00000005.pt").is_file()
    resume = ("--resume", str(parent), "--max-steps", "10")

    on_two = torchrun(tmp_path / "two", *resume, *ONE_TARGET, *drafters(2), nproc=3)
    threads_two = threads_run(tmp_path / "threads-two", *resume)
    finish(on_two, tmp_path / "two" / "torchrun.out")
    finish_threads(threads_two, tmp_path / "threads-two")
    on_one = torchrun(tmp_path / "one", *resume, *ONE_TARGET, *drafters(1), nproc=2)
    threads_one = threads_run(tmp_path / "threads-one", *resume, *ONE_TARGET, *drafters(1))
    finish(on_one, tmp_path / "one" / "torchrun.out")
    finish_threads(threads_one, tmp_path / "threads-one")

    for name, ref in (("two", "threads-two"), ("one", "threads-one")):
        run_dir = the_run_dir(tmp_path / name / "runs")
        assert f"resumed from {parent}" in (run_dir / "train.log").read_text()
        got, expected = metrics(run_dir), metrics(the_run_dir(tmp_path / ref))
        assert [m["step"] for m in got] == [m["step"] for m in expected] == [6, 7, 8, 9, 10]
        for m, e in zip(got, expected, strict=True):
            assert m["loss"] == pytest.approx(e["loss"], rel=REL_TOLERANCE), (name, m["step"])
            assert m["grad_norm"] == pytest.approx(e["grad_norm"], rel=REL_TOLERANCE)
            assert m["tokens"] == e["tokens"]


def test_a_bf16_reduce_with_one_drafter_rank_is_one_line_exit_2_before_any_rendezvous(tmp_path):
    """What torchrun --nproc-per-node 2 sets for rank 0 of a 1 + 1 job: refused before the
    process group, a run dir or a model (one drafter rank reduces nothing)."""
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), *PROCESSES]
    cmd += [*ONE_TARGET, *drafters(1), *BF16, "--run-root", str(tmp_path)]
    env = job_env({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert one_trainer_line(r.stderr) == (
        'error: config: runtime.grad_reduce_dtype = "bf16": this job has one drafter rank, so'
        " no gradient is reduced (its own is the step's); set runtime.grad_reduce_dtype ="
        ' "fp32" or add drafter ranks'
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "runtime.grad_reduce_dtype=bf16",
            'runtime.grad_reduce_dtype = "bf16": processes mode only',
        ),
        (
            "runtime.grad_reduce_dtype=fp16",
            'runtime.grad_reduce_dtype = "fp16": expected one of fp32, bf16',
        ),
    ],
)
def test_the_reduce_dtype_key_has_rules(override, said):
    from trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert said in str(e.value)
