"""One training step, split into the stages the pipeline threads run.

  prefetch (CPU):  batch -> anchors, keep                     `prepare_blocks`
  target:          input_ids -> concatenated layer features   `TargetFeatures.forward`
  drafter:         features + blocks -> loss and metrics      `drafter_loss`

Each stage is a plain function so that the single-threaded loop, the threaded pipeline and
the tests run exactly the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainer.data.samples import Batch
from trainer.model.attention import make_mask
from trainer.model.blocks import (
    block_labels_and_weights,
    block_rope_positions,
    block_token_ids,
    sample_anchors,
)
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import LossOutput, dflash_loss


@dataclass
class BlockBatch:
    """A batch with its anchors: everything the GPU stages need, built on the CPU."""

    batch: Batch
    anchors: Tensor  # int64 [B, N]
    keep: Tensor  # bool [B, N]
    epoch: int
    tokens: int = 0  # real (unpadded) tokens, counted on the CPU: reading it never syncs
    mask: Any = None  # the attention mask, built ahead by the target thread when set

    def to(self, device: torch.device, non_blocking: bool = False) -> BlockBatch:
        b = self.batch

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        moved = Batch(
            input_ids=b.input_ids.to(device, non_blocking=non_blocking),
            loss_mask=b.loss_mask.to(device, non_blocking=non_blocking),
            lengths=b.lengths.to(device, non_blocking=non_blocking),
            index=b.index,
            doc_ids=move(b.doc_ids),
            position_ids=move(b.position_ids),
        )
        return BlockBatch(
            batch=moved,
            anchors=self.anchors.to(device, non_blocking=non_blocking),
            keep=self.keep.to(device, non_blocking=non_blocking),
            epoch=self.epoch,
            tokens=self.tokens,
            mask=self.mask,
        )


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A per-batch seed: anchors depend only on (seed, epoch, batch), never on thread timing."""
    return (seed * 1_000_003 + epoch * 10_007 + index) % (2**63 - 1)


def prepare_blocks(batch: Batch, num_anchors: int, seed: int, epoch: int) -> BlockBatch:
    gen = torch.Generator().manual_seed(batch_seed(seed, epoch, batch.index))
    anchors, keep = sample_anchors(
        batch.loss_mask, batch.lengths, num_anchors, gen, doc_ids=batch.doc_ids
    )
    tokens = int(batch.lengths.sum())
    return BlockBatch(batch=batch, anchors=anchors, keep=keep, epoch=epoch, tokens=tokens)


def attach_mask(blocks: BlockBatch, backend: str, block_size: int) -> BlockBatch:
    """Build the attention mask now (in the target thread), off the drafter's critical path."""
    b = blocks.batch
    ctx_len = b.input_ids.shape[1]
    blocks.mask = make_mask(backend, blocks.anchors, blocks.keep, ctx_len, block_size, b.doc_ids)
    return blocks


@dataclass
class LossSettings:
    backend: str  # "flex" or "sdpa"
    block_size: int
    gamma: float
    chunk_blocks: int
    topk: int
    impl: str


def drafter_hidden(
    drafter: DFlashDrafter,
    blocks: BlockBatch,
    features: Tensor,
    backend: str,
    noise_std: float = 0.0,
    noise_generator: torch.Generator | None = None,
) -> Tensor:
    """The drafter's final hidden states for every block token: [B, N*bs, H]."""
    b = blocks.batch
    bs = drafter.arch.block_size
    if noise_std > 0:
        noise = torch.randn(
            features.shape, generator=noise_generator, device=features.device, dtype=features.dtype
        )
        features = features + noise_std * noise
    context = drafter.fuse_context(features)
    ctx_len = b.input_ids.shape[1]
    mask = blocks.mask
    if mask is None:
        mask = make_mask(backend, blocks.anchors, blocks.keep, ctx_len, bs, b.doc_ids)
    ids = block_token_ids(b.input_ids, blocks.anchors, bs, drafter.arch.mask_token_id)
    pos = block_rope_positions(blocks.anchors, bs, b.position_ids)
    if b.position_ids is None:  # unpacked: the call (and its compiled graph) as before
        return drafter(ids, pos, context, mask)
    return drafter(ids, pos, context, mask, b.position_ids)


def drafter_loss(
    drafter: DFlashDrafter,
    blocks: BlockBatch,
    features: Tensor,
    settings: LossSettings,
    noise_std: float = 0.0,
    noise_generator: torch.Generator | None = None,
) -> LossOutput:
    """Forward of the drafter on one batch and its loss; the caller runs backward."""
    b = blocks.batch
    hidden = drafter_hidden(drafter, blocks, features, settings.backend, noise_std, noise_generator)
    labels, weights = block_labels_and_weights(
        b.input_ids,
        b.loss_mask,
        blocks.anchors,
        blocks.keep,
        settings.block_size,
        settings.gamma,
        b.doc_ids,
    )
    return dflash_loss(
        hidden,
        drafter.lm_head_weight,
        labels,
        weights,
        settings.block_size,
        settings.chunk_blocks,
        settings.topk,
        settings.impl,
    )
