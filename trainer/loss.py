"""The DFlash loss over block predictions, in chunks, with metrics from the same logits.

The lm_head ([V, H], frozen, the target's) dominates a drafter step: 248,320 x 5,120 for a
27B target. So it runs once per chunk of blocks, and accuracy, acceptance length ("streak")
and top-K hits are read from those very logits, never from a second projection.

Two implementations, equal in value and gradient (tests check both):
  - "fused": one custom autograd function per chunk computes the loss *and* its gradient
    w.r.t. the hidden states in the forward pass, then frees the logits. The head is frozen,
    so no weight gradient is needed and the backward is a multiply: lm_head runs once.
  - "checkpoint": `torch.utils.checkpoint` around each chunk; the backward recomputes the
    logits (lm_head twice per chunk), the textbook form kept as a reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Order of the entries of LossOutput.stats (sums over the batch; divide at logging time).
STAT_NAMES = ("positions", "correct", "topk_hits", "streak_sum", "blocks")


@dataclass
class LossOutput:
    loss: Tensor  # scalar, weighted mean cross-entropy, differentiable
    stats: Tensor  # float32 [len(STAT_NAMES)], detached sums; no host sync needed

    def metrics(self) -> dict[str, float]:
        """Host-side metrics (syncs: call on logging steps only)."""
        s = dict(zip(STAT_NAMES, self.stats.tolist(), strict=True))
        positions, blocks = max(s["positions"], 1.0), max(s["blocks"], 1.0)
        return {
            "loss": float(self.loss.detach()),
            "acc": s["correct"] / positions,
            "topk": s["topk_hits"] / positions,
            "streak": s["streak_sum"] / blocks,
        }


def lm_head(hidden: Tensor, weight: Tensor) -> Tensor:
    """[R, H] @ [V, H]^T -> float32 logits [R, V]."""
    return (hidden.to(weight.dtype) @ weight.t()).float()


@torch.no_grad()
def _chunk_stats(
    logits: Tensor, labels: Tensor, weights: Tensor, block_size: int, topk: int
) -> Tensor:
    """Metric sums for whole blocks of rows; `logits` may be modified afterwards by the caller."""
    counted = weights > 0
    target_logit = logits.gather(1, labels[:, None])
    correct = (logits.argmax(dim=-1) == labels) & counted
    # Rank of the label = how many logits beat it; a top-K hit is rank < K.
    topk_hit = ((logits > target_logit).sum(dim=-1) < topk) & counted
    per_block = correct.view(-1, block_size)[:, 1:].long()
    streak = per_block.cumprod(dim=1).sum(dim=1) + 1  # accepted drafts + the target's token
    has_labels = counted.view(-1, block_size).any(dim=1)
    return torch.stack(
        [
            counted.sum(),
            correct.sum(),
            topk_hit.sum(),
            (streak * has_labels).sum(),
            has_labels.sum(),
        ]
    ).float()


class _FusedChunkLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        weights: Tensor,
        scale: Tensor,
        block_size: int,
        topk: int,
    ) -> tuple[Tensor, Tensor]:
        logits = lm_head(hidden, weight)
        stats = _chunk_stats(logits, labels, weights, block_size, topk)
        lse = torch.logsumexp(logits, dim=-1)
        ce = lse - logits.gather(1, labels[:, None]).squeeze(1)
        loss_sum = (ce * weights).sum()
        ctx.mark_non_differentiable(stats)
        if not ctx.needs_input_grad[0]:
            ctx.save_for_backward(None)
            return loss_sum * scale, stats
        # d loss / d logits = scale * w * (softmax - onehot), built in place over the logits.
        grad_logits = logits.sub_(lse[:, None]).exp_()
        grad_logits.scatter_add_(
            1, labels[:, None], torch.full_like(labels[:, None], -1.0, dtype=logits.dtype)
        )
        grad_logits.mul_((weights * scale)[:, None])
        grad_hidden = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
        ctx.save_for_backward(grad_hidden)
        return loss_sum * scale, stats

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_stats: Tensor) -> tuple[Any, ...]:
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), None, None, None, None, None, None


def _checkpointed_chunk(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    scale: Tensor,
    block_size: int,
    topk: int,
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden, weight)
    stats = _chunk_stats(logits.detach(), labels, weights, block_size, topk)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum() * scale, stats


def dflash_loss(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    block_size: int,
    chunk_blocks: int,
    topk: int = 4,
    impl: str = "fused",
) -> LossOutput:
    """hidden [B, N*bs, H]; labels/weights [B, N*bs]. Loss = sum(w * ce) / sum(w)."""
    H = hidden.shape[-1]
    h = hidden.reshape(-1, H)
    lab = labels.reshape(-1)
    w = weights.reshape(-1).float()
    # 1/sum(w) as a tensor: no host sync, and every chunk shares the same denominator.
    scale = 1.0 / w.sum().clamp(min=1e-6)
    rows = chunk_blocks * block_size
    loss = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(len(STAT_NAMES), device=hidden.device)
    for start in range(0, h.shape[0], rows):
        sl = slice(start, start + rows)
        if impl == "fused":
            part, st = _FusedChunkLoss.apply(
                h[sl], lm_head_weight, lab[sl], w[sl], scale, block_size, topk
            )
        elif impl == "checkpoint":
            part, st = checkpoint(
                _checkpointed_chunk,
                h[sl],
                lm_head_weight,
                lab[sl],
                w[sl],
                scale,
                block_size,
                topk,
                use_reentrant=False,
            )
        else:
            raise ValueError(f"train.loss_impl: unknown {impl!r}")
        loss = loss + part
        stats = stats + st
    return LossOutput(loss=loss, stats=stats)
