"""Masked attention for grouped-query heads without copying the keys and values per head.

HF's SDPA function repeats a GQA layer's keys and values to every query head whenever a mask
is given on CUDA (`repeat_kv`: SDPA's `enable_gqa` would fall back to its math kernel
there). The held-out eval's verify step gives a mask over its slot cache (every row its own
slots), so each of its forwards copied the whole cache, 4x, in every layer: on the H200,
668 of the graphed eval's 1,924 ms of kernels (8B shape, `bench/eval_bench.py --profile`).

Here the query heads that share a key/value head are laid side by side as one longer query,
[B, kv heads, group * L, D], and the mask is tiled to match: the same softmax per query row,
the same output, reading each key/value head once. HF does this itself for a single query
token (`pack_gqa`), not for the 16 of a verify step."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def grouped_query_applies(query: Tensor, key: Tensor, mask: Tensor | None) -> bool:
    """A boolean mask shared by all heads, and several query heads per key/value head."""
    return (
        mask is not None
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1] == 1
        and query.shape[1] > key.shape[1]
        and query.shape[1] % key.shape[1] == 0
    )


def grouped_query_sdpa(
    query: Tensor,  # [B, Hq, L, D]
    key: Tensor,  # [B, Hkv, S, D]
    value: Tensor,  # [B, Hkv, S, Dv]
    mask: Tensor,  # bool [B or 1, 1, L, S]: True = may attend
    scaling: float | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """HF's attention output layout, [B, L, Hq, Dv]. Query head h reads key/value head
    h // group, as `repeat_kv` orders them."""
    B, Hq, L, D = query.shape
    Hkv = key.shape[1]
    group = Hq // Hkv
    q = query.reshape(B, Hkv, group * L, D)  # rows j*L + l: head Hkv*.. + j, position l
    tiled = mask.repeat(1, 1, group, 1)  # row j*L + l gets position l's mask
    out = F.scaled_dot_product_attention(
        q, key, value, attn_mask=tiled, dropout_p=dropout, scale=scaling
    )
    return out.reshape(B, Hq, L, value.shape[-1]).transpose(1, 2).contiguous()


def grouped_or(
    fallback: Any, module: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
    dropout: float = 0.0, scaling: float | None = None, **kwargs: Any,
) -> tuple[Tensor, None]:  # fmt: skip
    """`grouped_query_sdpa` where it applies, else HF's function (`fallback`) unchanged."""
    if not grouped_query_applies(query, key, mask) or kwargs.get("position_bias") is not None:
        return fallback(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    assert mask is not None
    return grouped_query_sdpa(query, key, value, mask, scaling, dropout), None
