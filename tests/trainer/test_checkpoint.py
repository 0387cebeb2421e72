"""Checkpoints are whole or absent: a failure mid-save keeps the previous one. Each has a
sidecar that says whether it is good, and a resume takes the newest good one."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from trainer.model import checkpoint as ck
from trainer.model.checkpoint import (
    CheckpointWriter,
    TrainPosition,
    choose_good_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def save(run_dir, step, w=None, loss=1.0):
    return save_checkpoint(
        run_dir,
        TrainPosition(step=step, batches=2 * step, tokens=100 * step),
        {"w": torch.full((3,), float(step)) if w is None else w},
        {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": []},
        {"hidden_size": 8},
        {"name": "t"},
        loss,
    )


def test_round_trip_and_latest(tmp_path):
    save(tmp_path, 5)
    save(tmp_path, 10)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-00000010.pt"
    data = load_checkpoint(latest)
    assert data["position"] == {"step": 10, "batches": 20, "tokens": 1000}
    assert torch.equal(data["model"]["w"], torch.full((3,), 10.0))


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 5)

    def half_then_fail(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(ck.torch, "save", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 10)
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert files == ["step-00000005.json", "step-00000005.pt"]  # no step-10, no temp file
    assert load_checkpoint(latest_checkpoint(tmp_path))["position"]["step"] == 5


def test_a_leftover_temp_file_is_never_taken_for_a_checkpoint(tmp_path):
    save(tmp_path, 5)
    (tmp_path / "checkpoints" / ".step-00000010.pt.abc.tmp").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step-00000005.pt"


def test_the_sidecar_says_what_the_checkpoint_holds(tmp_path):
    path = save(tmp_path, 7, loss=2.5)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["step"] == 7 and meta["file"] == path.name
    assert meta["finite"] is True and meta["loss"] == 2.5
    assert meta["bytes"] == path.stat().st_size > 0


def test_a_resume_skips_checkpoints_written_after_the_run_went_nan(tmp_path):
    save(tmp_path, 100, loss=3.0)
    save(tmp_path, 200, w=torch.tensor([1.0, float("nan"), 2.0]), loss=float("nan"))
    save(tmp_path, 300, loss=float("nan"))  # finite weights, but the loss before it was not
    choice = choose_good_checkpoint(tmp_path)
    assert choice.name == "checkpoints/step-00000100.pt" and choice.step == 100
    assert dict(choice.skipped) == {
        "checkpoints/step-00000300.pt": "loss was nan before it",
        "checkpoints/step-00000200.pt": "weights or optimizer state not finite",
    }


def test_a_checkpoint_without_its_sidecar_is_checked_by_loading_it(tmp_path):
    save(tmp_path, 100)
    save(tmp_path, 200, w=torch.tensor([float("inf"), 0.0, 0.0]))
    (tmp_path / "checkpoints" / "step-00000200.json").unlink()  # a crash between the writes
    save(tmp_path, 300)
    (tmp_path / "checkpoints" / "step-00000300.json").write_text("{torn")
    choice = choose_good_checkpoint(tmp_path)
    # 300: its sidecar is unreadable, so the file is loaded and found good.
    assert choice.name == "checkpoints/step-00000300.pt" and choice.verified
    (tmp_path / "checkpoints" / "step-00000300.pt").write_bytes(b"not a zip")
    choice = choose_good_checkpoint(tmp_path)
    assert choice.name == "checkpoints/step-00000100.pt"
    reasons = dict(choice.skipped)
    assert reasons["checkpoints/step-00000200.pt"] == "weights or optimizer state not finite"
    assert reasons["checkpoints/step-00000300.pt"].startswith("unreadable")


def test_no_good_checkpoint_is_said_with_the_reasons(tmp_path):
    save(tmp_path, 5, loss=float("nan"))
    choice = choose_good_checkpoint(tmp_path)
    assert choice.name is None
    assert "no good checkpoint" in choice.describe() and "loss was nan" in choice.describe()


def test_the_writer_returns_before_the_file_is_written_and_keeps_the_snapshot(tmp_path):
    """Training goes on (and changes the weights) while the writer thread writes: the file
    holds the weights as they were at save time."""
    gate = threading.Event()
    saved = []
    writer = CheckpointWriter(tmp_path, saved.append)
    real_write = ck.write_checkpoint

    def slow_write(*a, **k):
        gate.wait(10)
        return real_write(*a, **k)

    w = torch.full((4,), 1.0)
    try:
        ck.write_checkpoint = slow_write
        writer.save(TrainPosition(3, 6, 30), {"w": w}, {"state": {}}, {}, {}, 0.5)
        assert writer.busy and not saved
        w.add_(100.0)  # the next optimizer step
        gate.set()
        writer.wait()
    finally:
        ck.write_checkpoint = real_write
    assert [s.meta.step for s in saved] == [3]
    data = load_checkpoint(latest_checkpoint(tmp_path))
    assert torch.equal(data["model"]["w"], torch.full((4,), 1.0))
    assert data["position"] == {"step": 3, "batches": 6, "tokens": 30}


def test_a_failed_write_is_raised_on_the_training_thread(tmp_path):
    writer = CheckpointWriter(tmp_path / "missing" / "deeper", lambda s: None)
    (tmp_path / "missing").write_text("a file where the run dir should be")
    writer.save(TrainPosition(1, 1, 1), {"w": torch.zeros(2)}, {"state": {}}, {}, {}, None)
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # raised once
