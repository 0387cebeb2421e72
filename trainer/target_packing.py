"""Document boundaries inside the target's forward, for packed rows (several documents a row).

A packed row says where each document starts through its `position_ids`: positions restart
at 0 at every document. The target must then compute each document's features exactly as it
would for that document alone:

- full attention: no token attends across a document boundary (a block-diagonal causal mask)
  and RoPE reads the restarting positions;
- Gated DeltaNet (the Qwen3.5/3.6 linear-attention layers): its causal conv and its recurrent
  state run along the whole row, and HF resets neither at a boundary unless it is given the
  boundaries. With flash-linear-attention and causal-conv1d installed (CUDA), HF's own layer
  takes them: the row is flattened to one sequence and `cu_seqlens` (fla's
  `chunk_gated_delta_rule`) and `seq_idx` (`causal_conv1d_fn`) keep documents apart. HF's
  torch fallback takes no boundaries (it refuses them), so there the documents are cut out
  and run side by side as a right-padded batch through the same HF layer: each one then is
  literally a document alone (right padding never reaches an earlier token: both the conv
  and the recurrence are causal).

Why split, not a reset inside the torch chunked rule: a reset is exact only by masking the
within-chunk decays and the state read/write per token, which is a rewrite of HF's reference
kernel kept in step by hand; a -inf decay at each start breaks the chunked algorithm (the
cumulative log-decay turns into inf - inf, or a huge finite value that loses fp32 precision).
The split reuses HF's code unchanged. Measured on 2 CPU cores (fp32, hidden 1024, 16 value
heads of 64, one GDN layer, bench in tests/trainer/test_target_packing.py's docstring):
the split's cost is the padding to the longest document of the batch plus one gather and
one scatter, and it ran at about the speed of the unpacked row; a per-document loop ran
slower (one small call per document). This path is the CPU/test path; a GPU run should have
the kernels, which take the boundaries directly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class DocBounds:
    """Where each document of a packed [B, S] batch lies. Computed once per batch."""

    doc: Tensor  # int64 [B*S]: each token's document, numbered over the flattened batch
    offset: Tensor  # int64 [B*S]: each token's index inside its document
    lengths: Tensor  # int64 [N]: each document's length
    max_len: int  # the longest document (one host sync, to size the split batch)
    row_doc: Tensor  # int64 [B, S]: `doc` per row, for the attention mask

    @classmethod
    def from_positions(cls, position_ids: Tensor) -> DocBounds:
        """A document starts where position_ids == 0, and at every row's first token."""
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids: expected [B, S], got {tuple(position_ids.shape)}")
        starts = position_ids == 0
        starts[:, 0] = True  # a row never continues the row above it
        flat = starts.reshape(-1)
        doc = torch.cumsum(flat, 0) - 1
        index = torch.arange(flat.numel(), device=flat.device)
        first = index[flat]  # each document's first flat index, in order
        offset = index - first[doc]
        lengths = torch.diff(first, append=first.new_tensor([flat.numel()]))
        return cls(
            doc=doc,
            offset=offset,
            lengths=lengths,
            max_len=int(lengths.max()),
            row_doc=doc.view(position_ids.shape),
        )

    @property
    def num_docs(self) -> int:
        return int(self.lengths.numel())

    def attention_mask(self) -> Tensor:
        """bool [B, 1, S, S]: True where query i may attend key j (same document, j <= i)."""
        d = self.row_doc
        s = d.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=d.device).tril()
        return ((d[:, :, None] == d[:, None, :]) & causal)[:, None]

    def cu_seqlens(self) -> Tensor:
        """int64 [N + 1]: the documents' starts in the flattened batch, then its length."""
        zero = self.lengths.new_zeros(1)
        return torch.cat([zero, torch.cumsum(self.lengths, 0)])

    def split(self, x: Tensor) -> Tensor:
        """[B, S, H] -> [N, max_len, H]: each document alone, right-padded with zeros."""
        flat = x.reshape(-1, x.shape[-1])
        out = flat.new_zeros(self.num_docs, self.max_len, x.shape[-1])
        out[self.doc, self.offset] = flat
        return out

    def join(self, docs: Tensor, shape: torch.Size) -> Tensor:
        """The inverse of `split`: [N, max_len, H] -> `shape` ([B, S, H])."""
        return docs[self.doc, self.offset].view(shape)


@functools.cache
def gdn_kernels_available() -> bool:
    """flash-linear-attention and causal-conv1d both importable: HF then takes boundaries."""
    try:
        from causal_conv1d import causal_conv1d_fn  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA extension
        return False
    return True


def gated_deltanet_packed(module: Any, x: Tensor, bounds: DocBounds) -> Tensor:
    """HF's Qwen3.5 GatedDeltaNet on a packed [B, S, H] input, documents kept apart."""
    if x.device.type == "cuda" and gdn_kernels_available():
        # fla needs one sequence (batch 1) with cu_seqlens; causal_conv1d takes seq_idx
        # (int32, per token) on a channel-last input, which is what HF's transpose gives it.
        flat = x.reshape(1, -1, x.shape[-1])
        seq_idx = bounds.doc.to(torch.int32)[None]
        out = module(flat, cu_seq_lens_q=bounds.cu_seqlens(), seq_idx=seq_idx)
        return out.view(x.shape)
    return bounds.join(module(bounds.split(x)), x.shape)


def hybrid_layer_packed(layer: Any, hidden: Tensor, bounds: DocBounds) -> Tensor:
    """One Qwen3.5 linear-attention decoder layer, as HF's, with the packed token mixer."""
    residual = hidden
    h = gated_deltanet_packed(layer.linear_attn, layer.input_layernorm(hidden), bounds)
    hidden = residual + h
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))
