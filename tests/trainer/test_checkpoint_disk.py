"""Checkpoints and the disk, on real trainer processes: the size forecast published before the
first save, a write that fails (a full tmpfs: ENOSPC, the H200's failure; RLIMIT_FSIZE: EFBIG
mid-write, through torch.save's `unexpected pos`), and train.keep_checkpoints.

Two ways to make a write fail, each for what it can do: a small tmpfs (`mount -t tmpfs -o
size=…`, root only: skipped otherwise) is a real full disk, statvfs and all; RLIMIT_FSIZE
(`ulimit -f`, any user) fails a write past the size with EFBIG while statvfs still shows free
space, so the write really starts and fails inside torch.save.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from dflash_tui.agent.runs import RunRoot
from tests.conftest import TINY_CONFIG, TrainerProcess
from trainer.model.checkpoint import (
    CheckpointFailed,
    TrainPosition,
    save_checkpoint,
)
from trainer.runtime.retention import prune

LONG = ("--max-steps", "100000", "--set", "train.log_every=1")
MB = 10**6


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """small_disk(bytes) -> a folder on a tmpfs of that size; unmounted at the end."""
    mounted: list[Path] = []

    def make(size: int) -> Path:
        d = tmp_path / f"disk-{len(mounted)}"
        d.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"no tmpfs without root: {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def trainer(root: Path, *args: str, preexec: Callable[[], None] | None = None) -> TrainerProcess:
    return TrainerProcess(
        root, "--config", str(TINY_CONFIG), "--set", "runtime.wandb_mode=disabled", *args,
        preexec_fn=preexec,
    )  # fmt: skip


def checkpoint_files(run_dir: Path) -> list[str]:
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def summary_of(p: TrainerProcess) -> str:
    """What `runs`, `kill` and status say of it: the agent's runs list, read from the files."""
    return RunRoot(str(p.run_root)).info(p.run_dir.name, None).outcome.summary


def test_the_forecast_is_within_5_percent_of_the_real_checkpoint(start_trainer) -> None:
    p = start_trainer("--max-steps", "2")
    assert p.wait() == 0
    plan = p.heartbeat()["checkpoints"]
    real = (p.run_dir / "checkpoints" / "step-00000002.pt").stat().st_size
    # The tiny drafter: 426,880 trained fp32 parameters in 25 tensors: 12 B each, 5.15 MB.
    assert abs(plan["forecast_bytes"] - real) <= 0.05 * real, (plan, real)
    assert (plan["every"], plan["keep"], plan["failed"]) == (200, 0, None)
    assert "checkpoints: about 5.1" in p.read("train.log")


def test_a_stop_on_a_full_disk_keeps_the_previous_checkpoint_and_says_so(
    small_disk, tiny_target_dir
) -> None:
    """An 8 MB tmpfs holds the run's logs and one 5.2 MB checkpoint (step 3), not a second:
    the step-6 save fails and the run goes on; the stop's own save fails too. Exit 0,
    `stopped`, the step-3 checkpoint is the resume point, and nothing else is on disk."""
    p = trainer(small_disk(8 * MB), *LONG, "--set", "train.checkpoint_every=3")
    try:
        failed = p.wait_for(
            lambda: (hb := p.heartbeat()) and (hb.get("checkpoints") or {}).get("failed"),
            what="a failed checkpoint",
        )
        assert failed["step"] == 6
        assert failed["message"].startswith("disk full (needed 5.1")
        p.wait_step(8)  # the run went on
        p.signal(signal.SIGTERM)
        assert p.wait() == 0
    finally:
        p.kill()
    hb = p.heartbeat()
    step = hb["step"]
    assert hb["phase"] == "stopped" and hb["exit_code"] == 0 and hb["error"] is None
    final = hb["checkpoints"]["failed"]
    assert final["step"] == step and final["message"].startswith("disk full (needed 5.1")
    assert hb["last_checkpoint"]["step"] == 3
    assert checkpoint_files(p.run_dir) == ["step-00000003.json", "step-00000003.pt"]
    log = p.read("train.log")
    assert f"checkpoint failed: {failed['message']} (step 6; the resume point stays step 3)" in log
    assert f"final checkpoint failed: {final['message']}; resumes from step 3" in log
    assert "crashed" not in log and "Traceback" not in log
    assert summary_of(p) == (
        f"stopped at step {step} of {hb['total_steps']}; final checkpoint failed: "
        f"{final['message']}; resumes from step 3"
    )


def no_writes_past(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death by signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_a_write_that_fails_inside_torch_save_is_said_in_one_line(
    tmp_path, tiny_target_dir
) -> None:
    """RLIMIT_FSIZE at 3 MB: the 5.2 MB checkpoint starts and fails with EFBIG inside
    torch.save (which raises `RuntimeError: ... unexpected pos`); the trainer says the file's
    own error, leaves no temp file, and the stop says no checkpoint of its own to resume."""
    p = trainer(tmp_path / "runs", *LONG, "--set", "train.checkpoint_every=2",
                preexec=no_writes_past(3 * MB))  # fmt: skip
    try:
        failed = p.wait_for(
            lambda: (hb := p.heartbeat()) and (hb.get("checkpoints") or {}).get("failed"),
            what="a failed checkpoint",
        )
        p.wait_step(5)
        p.signal(signal.SIGTERM)
        assert p.wait() == 0
    finally:
        p.kill()
    assert failed["step"] == 2
    assert failed["message"].startswith("File too large (EFBIG) (needed 5.1"), failed
    assert "unexpected pos" not in failed["message"]
    assert checkpoint_files(p.run_dir) == []  # no temp file, no sidecar
    hb = p.heartbeat()
    assert hb["phase"] == "stopped" and hb["exit_code"] == 0
    assert summary_of(p) == (
        f"stopped at step {hb['step']} of {hb['total_steps']}; final checkpoint failed: "
        f"{hb['checkpoints']['failed']['message']}; no checkpoint: a restart starts at 0"
    )


def test_enospc_mid_write_leaves_nothing_and_says_disk_full(small_disk) -> None:
    """A tmpfs with room for the tensors but not the file: the size check lets it start, the
    disk fills inside the write, the temp file is removed, the previous checkpoint stays."""
    disk = small_disk(2 * MB)
    state = ({"w": torch.zeros(1000)}, {"state": {}})
    save_checkpoint(disk, TrainPosition(1, 1, 1), *state, {}, {})
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    big = {"w": torch.zeros((free - 512) // 4)}
    with pytest.raises(CheckpointFailed) as e:
        save_checkpoint(disk, TrainPosition(2, 2, 2), big, {"state": {}}, {}, {})
    assert e.value.message.startswith("disk full (needed "), e.value.message
    assert checkpoint_files(disk) == ["step-00000001.json", "step-00000001.pt"]


def test_retention_keeps_the_newest_the_best_tau_and_the_resume_point(tmp_path) -> None:
    """Six checkpoints; step 2 has the best held-out τ; steps 5 and 6 were written after the
    run went NaN, so the resume point is step 4. keep = 1 keeps 6 (newest), 2 (best τ) and
    4 (resume point)."""
    for step in range(1, 7):
        w = torch.tensor([float("nan") if step >= 5 else 1.0])
        save_checkpoint(tmp_path, TrainPosition(step, step, step), {"w": w}, {"state": {}}, {}, {})
    (tmp_path / "eval").mkdir()
    for step, tau in ((2, 3.5), (4, 3.1), (6, 3.4)):
        record = {"step": step, "tau": tau, "held_out": True}
        (tmp_path / "eval" / f"step-{step:08d}.json").write_text(json.dumps(record))
    # An `eval --set` variant and a trained-on τ are not the run's held-out record.
    (tmp_path / "eval" / "step-00000003.json").write_text('{"tau": 9.9, "held_out": false}')
    assert prune(tmp_path, 0) == []
    assert prune(tmp_path, 1) == ["step-00000001.pt", "step-00000003.pt", "step-00000005.pt"]
    kept = checkpoint_files(tmp_path)
    assert kept == [f"step-0000000{s}.{x}" for s in (2, 4, 6) for x in ("json", "pt")]


def test_retention_keeps_a_checkpoint_whose_eval_may_still_run(tmp_path) -> None:
    """eval.every = 2: the newest record is step 2's; steps 4 and 6 are eval steps with no
    record yet (an eval can outlast a checkpoint period), so keep = 1 keeps them; steps 1, 3
    and 5 go. Once step 6's record is written, step 4's eval was passed over: it goes."""
    for step in range(1, 8):
        save_checkpoint(tmp_path, TrainPosition(step, step, step), {"w": torch.ones(1)},
                        {"state": {}}, {}, {})  # fmt: skip
    (tmp_path / "eval").mkdir()
    write = lambda step, tau: (tmp_path / "eval" / f"step-{step:08d}.json").write_text(  # noqa: E731
        json.dumps({"step": step, "tau": tau, "held_out": True})
    )
    write(2, 3.0)
    assert prune(tmp_path, 1, eval_every=2) == [
        "step-00000001.pt", "step-00000003.pt", "step-00000005.pt",
    ]  # fmt: skip
    write(6, 3.5)  # the new best: step 2 goes too
    assert prune(tmp_path, 1, eval_every=2) == ["step-00000002.pt", "step-00000004.pt"]
    assert [n for n in checkpoint_files(tmp_path) if n.endswith(".pt")] == [
        "step-00000006.pt", "step-00000007.pt",
    ]  # fmt: skip


def test_keep_checkpoints_prunes_after_each_save_in_a_real_run(start_trainer) -> None:
    p = start_trainer(
        "--max-steps", "8", "--set", "train.checkpoint_every=2", "--set",
        "train.keep_checkpoints=2",
    )  # fmt: skip
    assert p.wait() == 0
    assert checkpoint_files(p.run_dir) == [
        "step-00000006.json", "step-00000006.pt", "step-00000008.json", "step-00000008.pt",
    ]  # fmt: skip
    log = p.read("train.log")
    assert "checkpoints: removed step-00000002.pt (train.keep_checkpoints = 2;" in log
    assert p.heartbeat()["checkpoints"]["keep"] == 2


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_keep_checkpoints_is_one_line_and_exit_2(tmp_path, value) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(TINY_CONFIG), "--run-root",
         str(tmp_path), "--set", f"train.keep_checkpoints={value}"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("error: config: train.keep_checkpoints = ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
