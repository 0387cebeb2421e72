"""Drafter checkpoints: written atomically, found by step, loaded for resume or export.

A checkpoint holds only what the drafter trains (not the target's embedding or head), the
optimizer, and the data position. Anchors and feature noise are seeded per batch, so model +
optimizer + position reproduce an uninterrupted run exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.fsutil import atomic_write

_NAME = re.compile(r"^step-(\d+)\.pt$")


@dataclass
class TrainPosition:
    step: int  # optimizer steps done
    batches: int  # global batches consumed (all epochs, all drafter replicas)
    tokens: int  # real tokens trained on so far


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}.pt"


def save_checkpoint(
    run_dir: Path,
    position: TrainPosition,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    arch: dict[str, Any],
    config: dict[str, Any],
) -> Path:
    path = checkpoint_path(run_dir, position.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "position": position.__dict__,
        "model": {k: v.detach().cpu() for k, v in model_state.items()},
        "optimizer": optimizer_state,
        "arch": arch,
        "config": config,
    }
    # temp file + fsync + rename: a crash mid-save leaves the previous checkpoint intact.
    atomic_write(path, lambda f: torch.save(payload, f))
    return path


def latest_checkpoint(run_dir: Path) -> Path | None:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return max(steps)[1] if steps else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    if data.get("format") != 1:
        raise ValueError(f"checkpoint {path}: unknown format {data.get('format')!r}")
    return data
