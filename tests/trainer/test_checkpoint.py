"""Checkpoints are whole or absent: a failure mid-save keeps the previous one."""

from __future__ import annotations

import pytest
import torch

from trainer import checkpoint as ck
from trainer.checkpoint import TrainPosition, latest_checkpoint, load_checkpoint, save_checkpoint


def save(run_dir, step):
    return save_checkpoint(
        run_dir,
        TrainPosition(step=step, batches=2 * step, tokens=100 * step),
        {"w": torch.full((3,), float(step))},
        {"state": {}, "param_groups": []},
        {"hidden_size": 8},
        {"name": "t"},
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
    assert files == ["step-00000005.pt"]  # no step-10, no temp file
    assert load_checkpoint(latest_checkpoint(tmp_path))["position"]["step"] == 5


def test_a_leftover_temp_file_is_never_taken_for_a_checkpoint(tmp_path):
    save(tmp_path, 5)
    (tmp_path / "checkpoints" / ".step-00000010.pt.abc.tmp").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step-00000005.pt"
