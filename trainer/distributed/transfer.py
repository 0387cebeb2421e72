"""A batch and its target features from a target rank to a drafter rank, by torch.distributed
point-to-point ops (processes mode).

Each batch is four messages on one pair of ranks, in order: a fixed-size int64 header (the
batch number g, the shapes, the feature dtype, and the sender's queue depths), then the
batch's integer tensors flattened into one int64 message, its float32 loss mask, and the
features. Messages between two ranks arrive in the order they were sent, so the drafter
knows which batch comes next from the routing alone and the header only confirms it.

Only the sender's *bounded* number of unfinished sends stands in for q_hs: a gloo send
finishes once the receiver has taken it, so a target rank with `limit` sends in flight to
one drafter waits for the oldest before it starts another.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainer.data.samples import Batch
from trainer.model.step import BlockBatch

HEADER = 18
_MAX_DIMS = 4
_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass
class Received:
    g: int
    blocks: BlockBatch  # on the drafter rank's device
    features: Tensor
    q_pre: int  # the sender's q_pre depth when it sent this batch
    in_flight: int  # the sender's unfinished sends to this rank, this one included


def _header(g: int, blocks: BlockBatch, features: Tensor, q_pre: int, in_flight: int) -> list[int]:
    b = blocks.batch
    B, L = b.input_ids.shape
    N = blocks.anchors.shape[1]
    dims = list(features.shape) + [-1] * (_MAX_DIMS - features.dim())
    packed = int(b.position_ids is not None)
    return [
        g,
        blocks.epoch,
        b.index,
        blocks.tokens,
        B,
        L,
        N,
        packed,
        _DTYPES.index(features.dtype),
        q_pre,
        in_flight,
        features.dim(),
        *dims,
        0,
        0,
    ][:HEADER]


def _ints(blocks: BlockBatch) -> Tensor:
    b = blocks.batch
    parts = [b.input_ids, b.lengths, blocks.anchors, blocks.keep.to(torch.int64)]
    if b.position_ids is not None and b.doc_ids is not None:
        parts += [b.doc_ids, b.position_ids]
    return torch.cat([p.reshape(-1).to(torch.int64) for p in parts])


class FeatureSender:
    """A target rank's sends, at most `limit` unfinished per drafter rank."""

    def __init__(self, limit: int, comm_device: torch.device) -> None:
        self.limit, self.comm_device = limit, comm_device
        # Per destination rank: (its works, the tensors they read: kept alive until done).
        self._pending: dict[int, deque[tuple[list[Any], list[Tensor]]]] = {}

    def in_flight(self, dst: int) -> int:
        return len(self._pending.get(dst, ()))

    def wait_room(self, dst: int) -> None:
        """Block until fewer than `limit` sends to `dst` are unfinished."""
        queue = self._pending.setdefault(dst, deque())
        while len(queue) >= self.limit:
            works, _keep = queue.popleft()
            for w in works:
                w.wait()  # a lost peer raises here (gloo: "Connection closed by peer")

    def send(self, dst: int, g: int, blocks: BlockBatch, features: Tensor, q_pre: int) -> None:
        self.wait_room(dst)
        queue = self._pending[dst]
        dev = self.comm_device
        header = torch.tensor(
            _header(g, blocks, features, q_pre, len(queue) + 1), dtype=torch.int64, device=dev
        )
        tensors = [
            header,
            _ints(blocks).to(dev),
            blocks.batch.loss_mask.reshape(-1).to(dev, torch.float32),
            features.detach().reshape(-1).contiguous().to(dev),
        ]
        works = [dist.isend(t, dst) for t in tensors]
        queue.append((works, tensors))

    def flush(self) -> None:
        """Wait for every unfinished send (the run's end: the drafters take them all)."""
        for queue in self._pending.values():
            while queue:
                works, _keep = queue.popleft()
                for w in works:
                    w.wait()


def receive(src: int, device: torch.device, comm_device: torch.device) -> Received:
    """The next batch from target rank `src`, on `device`."""
    header = torch.empty(HEADER, dtype=torch.int64, device=comm_device)
    dist.recv(header, src)
    h = header.tolist()
    g, epoch, index, tokens, B, L, N, packed, dtype_code, q_pre, in_flight, ndim = h[:12]
    dims = h[12 : 12 + ndim]
    n_ints = B * L + B + 2 * B * N + (2 * B * L if packed else 0)
    ints = torch.empty(n_ints, dtype=torch.int64, device=comm_device)
    loss_mask = torch.empty(B * L, dtype=torch.float32, device=comm_device)
    numel = 1
    for d in dims:
        numel *= d
    features = torch.empty(numel, dtype=_DTYPES[dtype_code], device=comm_device)
    for t in (ints, loss_mask, features):
        dist.recv(t, src)
    ints, loss_mask, features = ints.to(device), loss_mask.to(device), features.to(device)
    sizes = [B * L, B, B * N, B * N] + ([B * L, B * L] if packed else [])
    parts = list(torch.split(ints, sizes))
    batch = Batch(
        input_ids=parts[0].view(B, L),
        loss_mask=loss_mask.view(B, L),
        lengths=parts[1],
        index=index,
        doc_ids=parts[4].view(B, L) if packed else None,
        position_ids=parts[5].view(B, L) if packed else None,
    )
    blocks = BlockBatch(
        batch=batch,
        anchors=parts[2].view(B, N),
        keep=parts[3].view(B, N).to(torch.bool),
        epoch=epoch,
        tokens=tokens,
    )
    return Received(g, blocks, features.view(*dims), q_pre, in_flight)
