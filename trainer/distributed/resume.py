"""processes mode's resume: the writer reads the checkpoint, every other rank is sent it.

Only the writer's host is sure to hold the checkpoint (a job over several hosts keeps one run
dir per host, and only node 0's has checkpoints/), so the writer alone reads it. Every rank
then takes the position from it (a target rank needs only that: where the data order
continues), and every drafter rank its weights and optimizer state, broadcast over the
drafter ranks' group. A job started without --resume on the writer starts from step 0 on
every rank, whatever the other hosts were given.

The state travels as raw bytes per tensor (gloo has no bfloat16 broadcast everywhere; bytes
are bytes), after a small picklable skeleton that says each tensor's dtype and shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.distributed.layout import DRAFTER, Job, RankLayout
from trainer.model.checkpoint import TrainPosition, load_checkpoint


@dataclass(frozen=True)
class _TensorSpec:
    """A tensor's place in the skeleton: the i-th tensor sent, its dtype and shape."""

    index: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _skeleton(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """`tree` with each tensor replaced by its spec (appended to `tensors` in order)."""
    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return _TensorSpec(len(tensors) - 1, tree.dtype, tuple(tree.shape))
    if isinstance(tree, dict):
        return {k: _skeleton(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_skeleton(v, tensors) for v in tree)
    return tree


def _fill(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _TensorSpec):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: _fill(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        return type(skeleton)(_fill(v, tensors) for v in skeleton)
    return skeleton


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def broadcast_state(state: Any, layout: RankLayout, job: Job) -> Any:
    """The writer's `state` (nested dicts/lists of tensors and plain values) on every drafter
    rank, tensors on the host. Called by every drafter rank; `state` is read on the writer."""
    tensors: list[torch.Tensor] = []
    box = [_skeleton(state, tensors) if layout.writer else None]
    dist.broadcast_object_list(box, src=layout.writer_rank, group=job.drafters)
    skeleton = box[0]
    if not layout.writer:
        specs: list[_TensorSpec] = []
        _collect(skeleton, specs)
        specs.sort(key=lambda spec: spec.index)
        tensors = [torch.empty(spec.shape, dtype=spec.dtype) for spec in specs]
    for t in tensors:
        raw = _as_bytes(t).to(job.comm_device)
        dist.broadcast(raw, src=layout.writer_rank, group=job.drafters)
        if not layout.writer:
            _as_bytes(t).copy_(raw.cpu())
    return _fill(skeleton, tensors)


def _collect(skeleton: Any, out: list[_TensorSpec]) -> None:
    if isinstance(skeleton, _TensorSpec):
        out.append(skeleton)
    elif isinstance(skeleton, dict):
        for v in skeleton.values():
            _collect(v, out)
    elif isinstance(skeleton, list | tuple):
        for v in skeleton:
            _collect(v, out)


def resume_from_writer(
    setup: Any, checkpoint: Path | None, layout: RankLayout, job: Job
) -> TrainPosition:
    """Where this rank starts: the writer's checkpoint's position (step 0 without one), with
    the drafter's weights and optimizer state restored on every drafter rank."""
    from trainer.runtime.run import restore_state

    data = load_checkpoint(checkpoint) if layout.writer and checkpoint is not None else None
    position = job.share(lambda: data["position"] if data is not None else None)
    if position is None:
        return TrainPosition(step=0, batches=0, tokens=0)
    if layout.role == DRAFTER:
        mine = {"model": data["model"], "optimizer": data["optimizer"]} if data else None
        state = broadcast_state(mine, layout, job)
        restore_state(setup, {**state, "position": position}, checkpoint or "the writer's")
    return TrainPosition(**position)
