"""The DFlash attention mask and the two backends that apply it.

Keys are `[context (ctx_len) ; block tokens (N * block_size)]`, queries are the block tokens.
A query in block n, anchored at position a_n, may attend to
  - context positions kv < a_n (strictly: the anchor's own hidden state does not exist yet
    at inference time, the `<=` bug fixed by SpecForge PR #473),
  - every token of its own block (bidirectional within the block),
and nothing else. A padded block (keep = False) attends to nothing. In a packed row
(`doc_ids` given, see trainer.data.packing) a context position counts only when it lies in the
anchor's own document: no block sees another document.

Backends:
  - "sdpa": a dense boolean mask and `scaled_dot_product_attention` (CPU; flex has no CPU
    backward). Rows with nothing visible are given one harmless key and zeroed afterwards, so
    they produce no NaN.
  - "flex": a block-sparse `BlockMask` plus compiled `flex_attention` (CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def dense_dflash_mask(
    anchors: Tensor, keep: Tensor, ctx_len: int, block_size: int, doc_ids: Tensor | None = None
) -> Tensor:
    """bool[B, N*bs, ctx_len + N*bs]; True = may attend."""
    N = anchors.shape[1]
    device = anchors.device
    q_block = torch.arange(N * block_size, device=device) // block_size  # [Q]
    kv = torch.arange(ctx_len + N * block_size, device=device)  # [KV]
    q_anchor = anchors[:, q_block]  # [B, Q]
    q_keep = keep[:, q_block].bool()  # [B, Q]
    is_ctx = kv < ctx_len
    ctx_ok = is_ctx[None, None, :] & (kv[None, None, :] < q_anchor[:, :, None])
    if doc_ids is not None:
        q_doc = doc_ids.gather(1, anchors)[:, q_block]  # [B, Q]
        kv_doc = doc_ids.gather(1, kv.clamp(max=ctx_len - 1).expand(doc_ids.shape[0], -1))
        ctx_ok = ctx_ok & (kv_doc[:, None, :] == q_doc[:, :, None])
    kv_block = (kv - ctx_len).clamp(min=0) // block_size
    own = (~is_ctx)[None, None, :] & (kv_block[None, None, :] == q_block[None, :, None])
    return (ctx_ok | own) & q_keep[:, :, None]


def dflash_mask_mod(
    anchors: Tensor, keep: Tensor, ctx_len: int, block_size: int, doc_ids: Tensor | None = None
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The same predicate as `dense_dflash_mask`, in flex_attention's mask_mod form."""
    keep_b = keep.bool()

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        blk = q_idx // block_size
        anchor = anchors[b, blk]
        is_ctx = kv_idx < ctx_len
        ctx_ok = is_ctx & (kv_idx < anchor)
        own = (~is_ctx) & ((kv_idx - ctx_len) // block_size == blk)
        return keep_b[b, blk] & (ctx_ok | own)

    if doc_ids is None:
        return mask_mod
    anchor_doc = doc_ids.gather(1, anchors)  # [B, N]

    def packed_mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        # kv_idx runs past the context into the blocks: clamp the lookup, `own` covers those.
        kv_doc = doc_ids[b, torch.clamp(kv_idx, max=ctx_len - 1)]
        same = (kv_idx >= ctx_len) | (kv_doc == anchor_doc[b, q_idx // block_size])
        return mask_mod(b, h, q_idx, kv_idx) & same

    return packed_mask_mod


@dataclass
class DenseMask:
    """SDPA form: the boolean mask, with rows that see nothing patched to avoid NaN."""

    mask: Tensor  # bool [B, 1, Q, KV], every row has at least one True
    empty_rows: Tensor  # bool [B, 1, Q, 1]: rows whose output must be zeroed


def make_dense_mask(
    anchors: Tensor, keep: Tensor, ctx_len: int, block_size: int, doc_ids: Tensor | None = None
) -> DenseMask:
    mask = dense_dflash_mask(anchors, keep, ctx_len, block_size, doc_ids)[:, None]
    empty = ~mask.any(dim=-1, keepdim=True)
    # An all-False row would make softmax NaN (and its gradient NaN everywhere it flows):
    # let it see every key, then zero its output.
    return DenseMask(mask=mask | empty, empty_rows=empty)


_compiled_flex: Any = None


def compiled_flex_attention() -> Any:
    """One process-wide compiled flex_attention (compiling it per call would recompile)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def forget_compiled_flex() -> None:
    """Drop the compiled flex_attention, so the next call compiles anew (with new
    `FLEX_KERNEL_OPTIONS`, after `torch._dynamo.reset()`: bench/drafter_step.py)."""
    global _compiled_flex
    _compiled_flex = None


FLEX_TILE = 128  # flex_attention's default query and key tile

# flex_attention's Triton kernel options for the drafter's mask; None = torch's own
# heuristics. bench/drafter_step.py (`--only attention`) times candidates on the GPU.
FLEX_KERNEL_OPTIONS: dict[str, Any] | None = None


def _doc_starts(doc_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per position: the first position of its document anywhere in the row, and the start
    of the contiguous run of that document it lies in ([B, S] each; equal for a packed row,
    whose documents are contiguous). Doc ids are < S (each document has a token)."""
    B, S = doc_ids.shape
    pos = torch.arange(S, device=doc_ids.device).expand(B, S)
    ids = doc_ids.clamp(0, S - 1)
    first = torch.full((B, S), S, device=doc_ids.device, dtype=pos.dtype)
    first = first.scatter_reduce(1, ids, pos, "amin").gather(1, ids)
    new_run = torch.ones_like(doc_ids, dtype=torch.bool)
    new_run[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    run_start = torch.where(new_run, pos, torch.zeros_like(pos)).cummax(dim=1).values
    return first, run_start


def dflash_tiles(
    anchors: Tensor, keep: Tensor, ctx_len: int, block_size: int, doc_ids: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Which (query tile, key tile) pairs of the DFlash mask hold any allowed pair (`partial`:
    the mask is applied there) and which hold only allowed pairs (`full`: no mask needed),
    bool [B, QT, KVT] each, from the mask's structure: no [Q, KV] evaluation, no compile.
    A query tile holds FLEX_TILE // block_size anchors' blocks."""
    B, N = anchors.shape
    per = FLEX_TILE // block_size
    QT = -(-N // per)
    KVT = -(-(ctx_len + N * block_size) // FLEX_TILE)
    dev = anchors.device
    pad = QT * per - N
    anchors_p = torch.nn.functional.pad(anchors, (0, pad))
    keep_p = torch.nn.functional.pad(keep.bool(), (0, pad))  # padding rows see nothing
    if doc_ids is None:
        lo_first = lo_run = torch.zeros_like(anchors_p)
    else:
        first, run_start = _doc_starts(doc_ids)
        at = anchors_p.clamp(0, ctx_len - 1)
        lo_first, lo_run = first.gather(1, at), run_start.gather(1, at)
    a = anchors_p.view(B, QT, per, 1)
    k = keep_p.view(B, QT, per, 1)
    lo_first, lo_run = lo_first.view(B, QT, per, 1), lo_run.view(B, QT, per, 1)
    start = torch.arange(KVT, device=dev) * FLEX_TILE  # each key tile's first position
    end = start + FLEX_TILE
    # Context: keys in [start of the anchor's document, anchor).
    ctx_any = k & (start < a) & (end > lo_first) & (start < ctx_len)
    ctx_all = k & (start >= lo_run) & (end <= a) & (end <= ctx_len)
    # The blocks: query block n sees its own block's keys, ctx_len + n*bs ... + bs - 1.
    n = torch.arange(QT * per, device=dev).view(1, QT, per, 1)
    first_tile = (ctx_len + n * block_size) // FLEX_TILE
    last_tile = (ctx_len + n * block_size + block_size - 1) // FLEX_TILE
    tile = torch.arange(KVT, device=dev)
    own = k & (tile >= first_tile) & (tile <= last_tile)
    full = ctx_all.all(dim=2)
    partial = (ctx_any | own).any(dim=2) & ~full
    return partial, full


def _ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """bool [B, QT, KVT] -> flex's (num_blocks [B, 1, QT], indices [B, 1, QT, KVT]), int32."""
    num = tiles.sum(dim=-1, dtype=torch.int32)
    idx = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[:, None], idx[:, None]


def make_block_mask(
    anchors: Tensor, keep: Tensor, ctx_len: int, block_size: int, doc_ids: Tensor | None = None
) -> Any:
    """Block-sparse mask for flex_attention. H=None: every head shares the mask.

    Built from the mask's structure (`dflash_tiles`): a few small tensor ops, nothing to
    compile. `create_block_mask` evaluates the mask_mod over every pair instead, and compiled
    (as it must be to be fast on the GPU) its kernels took ~150 s of a 225 s cold start.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    N = anchors.shape[1]
    mask_mod = dflash_mask_mod(anchors, keep, ctx_len, block_size, doc_ids)
    Q, KV = N * block_size, ctx_len + N * block_size
    if FLEX_TILE % block_size:  # a block would straddle query tiles: the generic builder
        return create_block_mask(mask_mod, anchors.shape[0], None, Q, KV, device=anchors.device)
    partial, full = dflash_tiles(anchors, keep, ctx_len, block_size, doc_ids)
    num, idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=FLEX_TILE, mask_mod=mask_mod, seq_lengths=(Q, KV)
    )


def attend(q: Tensor, k: Tensor, v: Tensor, mask: DenseMask | Any | None) -> Tensor:
    """q [B, Hq, Q, D]; k, v [B, Hkv, KV, D] (GQA when Hq > Hkv). mask None = full attention."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if isinstance(mask, DenseMask):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.mask, enable_gqa=gqa)
        return out.masked_fill(mask.empty_rows, 0.0)
    return compiled_flex_attention()(
        q, k, v, block_mask=mask, enable_gqa=gqa, kernel_options=FLEX_KERNEL_OPTIONS
    )


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if name == "flex" and device.type == "cpu":
        raise ValueError(
            "train.attention: 'flex' has no backward pass on CPU; use 'sdpa' or 'auto'"
        )
    return name


def make_mask(
    backend: str,
    anchors: Tensor,
    keep: Tensor,
    ctx_len: int,
    block_size: int,
    doc_ids: Tensor | None = None,
) -> DenseMask | Any:
    if backend == "flex":
        return make_block_mask(anchors, keep, ctx_len, block_size, doc_ids)
    return make_dense_mask(anchors, keep, ctx_len, block_size, doc_ids)
