"""Training blocks: where they start (anchors), what they hold, what they must predict.

A block anchored at position a is `[token[a], MASK x (bs-1)]` at positions a..a+bs-1.
Block position k (k >= 1) predicts token[a+k]; position 0 is the known anchor token.
Anchors are padded to a fixed count with a keep mask so that every batch has one shape.

In a packed row (`doc_ids` given) a block belongs to its anchor's document: the anchor
needs its next token in the same document, and targets past the document's end weigh 0,
exactly as targets past the end of an unpacked row do.
"""

from __future__ import annotations

import torch
from torch import Tensor

# DFlash's loss decay per block size (paper, Sec. 4): gamma = 7 for 16, 5 for 10, 4 for 8.
_DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return _DEFAULT_GAMMA.get(block_size, max(1.0, 0.45 * block_size))


def sample_anchors(
    loss_mask: Tensor,
    lengths: Tensor,
    num_anchors: int,
    generator: torch.Generator | None = None,
    doc_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample up to `num_anchors` distinct anchors per row inside the loss mask, sorted.

    A position a is a valid anchor when loss_mask[a] is set and a+1 is inside the sequence
    (at least one label exists), and, in a packed row, in a's document.
    Returns anchors int64 [B, N] (padding = 0) and keep bool [B, N].
    """
    B, S = loss_mask.shape
    pos = torch.arange(S, device=loss_mask.device)
    valid = (loss_mask > 0) & (pos[None, :] + 1 < lengths[:, None])
    if doc_ids is not None:
        same_next = torch.zeros_like(valid)
        same_next[:, :-1] = doc_ids[:, 1:] == doc_ids[:, :-1]
        valid &= same_next
    # Random keys, invalid positions pushed past every valid one; the N smallest keys win.
    # Sampled where the batch lives: the prefetch threads do this on CPU, off the GPU's path.
    keys = torch.rand(B, S, generator=generator, device=loss_mask.device)
    keys = torch.where(valid, keys, 2.0)
    n = min(num_anchors, S)
    chosen = keys.topk(n, dim=1, largest=False).indices
    chosen_valid = valid.gather(1, chosen)
    # Sort kept anchors ascending; padded slots go to the end.
    order_key = torch.where(chosen_valid, chosen, S + 1)
    order_key, _ = order_key.sort(dim=1)
    keep = order_key <= S
    anchors = torch.where(keep, order_key, 0)
    if n < num_anchors:
        pad = num_anchors - n
        anchors = torch.cat([anchors, anchors.new_zeros(B, pad)], dim=1)
        keep = torch.cat([keep, keep.new_zeros(B, pad)], dim=1)
    return anchors, keep


def block_positions(anchors: Tensor, block_size: int) -> Tensor:
    """[B, N] -> [B, N*bs]: anchor + k."""
    k = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + k).flatten(1)


def block_rope_positions(anchors: Tensor, block_size: int, position_ids: Tensor | None) -> Tensor:
    """[B, N*bs]: the positions RoPE gives a block's tokens: the anchor's position in its
    document (its index, unpacked) plus k."""
    if position_ids is None:
        return block_positions(anchors, block_size)
    return block_positions(position_ids.gather(1, anchors), block_size)


def block_token_ids(
    input_ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int
) -> Tensor:
    """[B, N*bs]: the anchor token, then mask tokens."""
    B, N = anchors.shape
    ids = torch.full(
        (B, N, block_size), mask_token_id, dtype=input_ids.dtype, device=anchors.device
    )
    ids[:, :, 0] = input_ids.gather(1, anchors)
    return ids.flatten(1)


def block_labels_and_weights(
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Tensor,
    keep: Tensor,
    block_size: int,
    gamma: float,
    doc_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """labels int64 [B, N*bs] and weights float32 [B, N*bs].

    weight = keep * (a+k < S) * loss_mask[a+k] * exp(-(k-1)/gamma), and 0 at k = 0;
    packed, also 0 where a+k lies in another document than a.
    """
    B, S = input_ids.shape
    pos = block_positions(anchors, block_size).view(B, -1, block_size)  # [B, N, bs]
    in_seq = pos < S
    idx = pos.clamp(max=S - 1).flatten(1)
    labels = torch.where(in_seq.flatten(1), input_ids.gather(1, idx), 0)
    k = torch.arange(block_size, device=anchors.device, dtype=torch.float32)
    # Position 0 (the anchor itself) has no loss. Masked by multiplication: `decay[0] = 0`
    # would copy a host scalar to the GPU, a host sync on every step.
    decay = torch.exp(-(k - 1) / gamma) * (k > 0)
    w = loss_mask.float().gather(1, idx).view(B, -1, block_size)
    w = w * in_seq * keep[:, :, None].float() * decay
    if doc_ids is not None:
        same_doc = (
            doc_ids.gather(1, idx).view(B, -1, block_size) == doc_ids.gather(1, anchors)[:, :, None]
        )
        w = w * same_doc
    return labels, w.flatten(1)
