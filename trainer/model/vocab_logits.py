"""A few rows against the whole vocabulary, as one GEMM that reads the head's weight once.

Decoding verifies 16-128 rows a step against a [V, H] head (151,936 x 4,096 on Qwen3: 1.24 GB).
Left to `hidden @ W.t()` or HF's `lm_head(hidden)`, an H100's cuBLAS took 3.5 ms for 128 rows
(a 384x16 tile: the weight read once per 16 rows) and a strided `hidden[:, 1:]` went through
`bmm` with the weight expanded per row (1.7 ms); reading the weight once takes ~0.4 ms
(bench/logits_gemm.py measures the forms; bench/results-eval/h100-1207-* the profile).

`vocab_logits` flattens the rows into one contiguous [N, H] matrix (no expanded `bmm`) and
computes the product with the weight as the GEMM's first operand (out^T = W @ h^T), so that
cuBLAS tiles the vocabulary, not the few rows. Not yet timed on a GPU: no machine came on
12-07 evening; bench/logits_gemm.py is the check, and the form to change if another wins.

For the target, HF computes logits inside its forward: `no_logits` asks it for none
(`logits_to_keep` as an empty index), and `target_logits` makes them from the final-normed
hidden state it returns anyway.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def vocab_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """hidden [..., H] x weight [V, H] -> logits [..., V] in hidden's dtype."""
    lead, h = hidden.shape[:-1], hidden.shape[-1]
    rows = hidden.reshape(-1, h)  # one copy when hidden is a strided slice
    out = (weight @ rows.t()).t()
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def no_logits(device: torch.device) -> Tensor:
    """HF's `logits_to_keep` that keeps no position: its lm_head then multiplies nothing."""
    return torch.zeros(0, dtype=torch.long, device=device)


def target_logits(model: Any, hidden_states: tuple[Tensor, ...]) -> Tensor:
    """The target's logits from its output's `hidden_states` (the last entry is the
    final-normed one), through its own output head."""
    head = model.get_output_embeddings()
    return vocab_logits(hidden_states[-1], head.weight, getattr(head, "bias", None))
