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
    logits: Tensor, labels: Tensor, weights: Tensor, block_rows: int, topk: int
) -> Tensor:
    """Metric sums for whole blocks of rows, from float logits (the checkpointed path)."""
    target_logit = logits.gather(1, labels[:, None])
    # Rank of the label = how many logits beat it; a top-K hit is rank < K.
    rank = (logits > target_logit).sum(dim=-1)
    return _stats_from(logits.argmax(dim=-1), rank, labels, weights, block_rows, topk)


def _ce_math(
    logits_lp: Tensor, labels: Tensor, weights: Tensor, scale: Tensor, need_grad: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Per row: cross-entropy, argmax, the label's rank; and d loss / d logits.

    One read of the (bf16) logits for the reductions and one for the gradient: compiled on
    CUDA this is two fused kernels instead of ~10 full passes over a [rows, vocab] fp32 array
    (for a 152K vocab that is the difference between ~3 and ~30 ms per step)."""
    logits = logits_lp.float()
    target = logits.gather(1, labels[:, None])
    lse = torch.logsumexp(logits, dim=-1)
    ce = lse - target.squeeze(1)
    pred = logits.argmax(dim=-1)
    rank = (logits > target).sum(dim=-1)  # how many logits beat the label
    grad = None
    if need_grad:
        vocab = torch.arange(logits.shape[1], device=logits.device)
        onehot = (vocab[None, :] == labels[:, None]).to(logits.dtype)
        grad = ((torch.exp(logits - lse[:, None]) - onehot) * (weights * scale)[:, None]).to(
            logits_lp.dtype
        )
    return ce, pred, rank, grad


_compiled_ce: Any = None


def ce_math(logits_lp: Tensor, *args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """`_ce_math`, compiled once per process on CUDA (eager on CPU, where tests run)."""
    global _compiled_ce
    if logits_lp.device.type != "cuda":
        return _ce_math(logits_lp, *args)
    if _compiled_ce is None:
        _compiled_ce = torch.compile(_ce_math, dynamic=False)
    result: tuple[Tensor, Tensor, Tensor, Tensor | None] = _compiled_ce(logits_lp, *args)
    return result


def _stats_from(
    pred: Tensor, rank: Tensor, labels: Tensor, weights: Tensor, block_rows: int, topk: int
) -> Tensor:
    """`block_rows`: a block's predicted positions 1 .. bs-1, one row each (the anchor's row
    is not among them: see `dflash_loss`)."""
    counted = weights > 0
    correct = (pred == labels) & counted
    topk_hit = (rank < topk) & counted
    per_block = correct.view(-1, block_rows).long()
    streak = per_block.cumprod(dim=1).sum(dim=1) + 1
    has_labels = counted.view(-1, block_rows).any(dim=1)
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
        block_rows: int,
        topk: int,
    ) -> tuple[Tensor, Tensor]:
        # lm_head once, in the weight's dtype (bf16 on GPU); the math reads it in fp32.
        logits_lp = hidden.to(weight.dtype) @ weight.t()
        need_grad = bool(ctx.needs_input_grad[0])
        ce, pred, rank, grad_logits = ce_math(logits_lp, labels, weights, scale, need_grad)
        del logits_lp
        stats = _stats_from(pred, rank, labels, weights, block_rows, topk)
        loss_sum = (ce * weights).sum()
        ctx.mark_non_differentiable(stats)
        if grad_logits is None:
            ctx.save_for_backward(None)
            return loss_sum * scale, stats
        # d loss / d hidden = (scale * w * (softmax - onehot)) @ W: the head is frozen, so this
        # is all the backward will need.
        grad_hidden = (grad_logits @ weight).to(hidden.dtype)
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
    block_rows: int,
    topk: int,
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden, weight)
    stats = _chunk_stats(logits.detach(), labels, weights, block_rows, topk)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    return (ce * weights).sum() * scale, stats


def predicted_rows(t: Tensor, block_size: int) -> Tensor:
    """[B, N*bs, ...] -> [B*N*(bs-1), ...]: every block's positions 1 .. bs-1, the anchor's
    row dropped."""
    B = t.shape[0]
    return t.reshape(B, -1, block_size, *t.shape[2:])[:, :, 1:].reshape(-1, *t.shape[2:])


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
    """hidden [B, N*bs, H]; labels/weights [B, N*bs]. Loss = sum(w * ce) / sum(w).

    A block's position 0 is its anchor, a known token: its weight is 0 by construction
    (`block_labels_and_weights`), so its row never reaches lm_head. That is 1/bs of the
    head's work (the largest matmul of a step) not done; the loss, its gradient and every
    metric are the same (tests/trainer/test_loss.py)."""
    h = predicted_rows(hidden, block_size)
    lab = predicted_rows(labels, block_size)
    w = predicted_rows(weights, block_size).float()
    block_rows = block_size - 1
    # 1/sum(w) as a tensor: no host sync, and every chunk shares the same denominator.
    scale = 1.0 / w.sum().clamp(min=1e-6)
    rows = chunk_blocks * block_rows
    loss = hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(len(STAT_NAMES), device=hidden.device)
    for start in range(0, h.shape[0], rows):
        sl = slice(start, start + rows)
        if impl == "fused":
            part, st = _FusedChunkLoss.apply(
                h[sl], lm_head_weight, lab[sl], w[sl], scale, block_rows, topk
            )
        elif impl == "checkpoint":
            part, st = checkpoint(
                _checkpointed_chunk,
                h[sl],
                lm_head_weight,
                lab[sl],
                w[sl],
                scale,
                block_rows,
                topk,
                use_reentrant=False,
            )
        else:
            raise ValueError(f"train.loss_impl: unknown {impl!r}")
        loss = loss + part
        stats = stats + st
    return LossOutput(loss=loss, stats=stats)
