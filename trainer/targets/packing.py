"""Document boundaries inside the target's forward, for packed rows (several documents a row).

A packed row says where each document starts through its `position_ids`: positions restart
at 0 at every document. The target must then compute each document's features exactly as it
would for that document alone:

- full attention: no token attends across a document boundary (a block-diagonal causal mask)
  and RoPE reads the restarting positions;
- Gated DeltaNet (the Qwen3.5/3.6 linear-attention layers): its causal conv and its recurrent
  state run along the whole row, and HF resets neither at a boundary unless it is given the
  boundaries. With flash-linear-attention installed (CUDA), `gated_deltanet_fla` runs HF's
  layer's arithmetic on the batch flattened to one sequence, and fla's `causal_conv1d` and
  `chunk_gated_delta_rule`, given `cu_seqlens`, keep documents apart. HF's
  torch fallback takes no boundaries (it refuses them), so there the documents are cut out
  and run through the same HF layer as right-padded batches of similar lengths: each one is
  then literally a document alone (right padding never reaches an earlier token: both the
  conv and the recurrence are causal).

Why split, not a reset inside the torch chunked rule: a reset is exact only by masking the
within-chunk decays and the state's read and write per token, a rewrite of HF's reference
kernel kept in step by hand; a -inf decay at each start breaks the chunked algorithm (the
cumulative log-decay turns into inf - inf, or with a huge finite value loses fp32
precision for the rest of the chunk). The split reuses HF's code unchanged.
`bench/gdn_packing_cpu.py` measured it on this 2-core machine (shared, so +-20%): one GDN
layer, hidden 1024, two rows of 1024 tokens, fp32, one thread. The row run whole without
boundaries took 1.8-2.2 s; grouped per-document batches 1.9-2.2 s (8 even documents, 9
skewed ones from 50 to 824 tokens, 48 short ones); one call per document 1.5-2.7 s (slowest
with many short documents). One padded batch of all documents, before grouping, took 3.6 s
on the skewed rows (9 documents padded to 824). This is the CPU/test path: a GPU run should
have fla, whose kernels take the boundaries directly (checked against each document alone on
the H200 by `bench/hybrid_forward.py` and tests/trainer/test_gpu.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class DocBounds:
    """Where each document of a packed [B, S] batch lies. Computed once per batch."""

    doc: Tensor  # int64 [B*S]: each token's document, numbered over the flattened batch
    offset: Tensor  # int64 [B*S]: each token's index inside its document
    lengths: Tensor  # int64 [N]: each document's length
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

    def groups(self, waste: float = 1.25) -> list[list[int]]:
        """The documents in groups of similar length, longest first: a group, right-padded
        to its longest, holds at most `waste` times its own tokens (one host sync)."""
        lengths = self.lengths.tolist()
        out: list[list[int]] = []
        group: list[int] = []
        tokens = 0
        for d in sorted(range(len(lengths)), key=lambda d: -lengths[d]):
            if group and (len(group) + 1) * lengths[group[0]] > waste * (tokens + lengths[d]):
                out.append(group)
                group, tokens = [], 0
            group.append(d)
            tokens += lengths[d]
        out.append(group)
        return out

    def per_document(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """fn applied to each document of x ([B, S, H]) alone: the documents of a group go
        through fn side by side as one right-padded batch; the outputs go back in place."""
        flat = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(flat)
        starts = self.cu_seqlens()[:-1]
        for group in self.groups():
            docs = torch.tensor(group, device=x.device)
            longest = int(self.lengths[group[0]])
            step = torch.arange(longest, device=x.device)
            index = starts[docs, None] + step  # [n, longest]
            valid = step < self.lengths[docs, None]
            index = torch.where(valid, index, 0)
            batch = flat[index] * valid[..., None]  # zeros after each document's end
            out[index[valid]] = fn(batch)[valid]
        return out.view(x.shape)


@functools.cache
def fla_available() -> bool:
    """flash-linear-attention importable (its Triton kernels need CUDA)."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or a Triton/CUDA mismatch at import
        return False
    return True


def gated_deltanet_fla(
    m: Any, x: Tensor, bounds: DocBounds, parts: HybridLayerParts | None = None
) -> Tensor:
    """HF's Qwen3.5 GatedDeltaNet forward (transformers 5.17-5.24: same weights, same order
    of operations) on the whole batch flattened to one sequence, with fla's kernels given
    the documents' `cu_seqlens`: its causal conv and its chunked delta rule both restart at
    every document. Only flash-linear-attention is needed (not causal-conv1d, a CUDA build
    that cannot be installed offline): fla has its own conv with boundaries."""
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    shape = x.shape
    flat = x.reshape(1, -1, shape[-1])
    T = flat.shape[1]
    cu = bounds.cu_seqlens()
    qkv, _ = causal_conv1d(
        m.in_proj_qkv(flat),
        weight=m.conv1d.weight.squeeze(1),
        bias=m.conv1d.bias,
        activation=m.activation,
        cu_seqlens=cu,
    )
    q, k, v = torch.split(qkv, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
    q = q.reshape(1, T, -1, m.head_k_dim)
    k = k.reshape(1, T, -1, m.head_k_dim)
    v = v.reshape(1, T, -1, m.head_v_dim)
    beta, g = (gdn_gates if parts is None else parts.gates)(m, flat)
    out, _ = chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    if parts is None:
        z = m.in_proj_z(flat)
        out = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))
        return m.out_proj(out.reshape(1, T, -1)).view(shape)
    return parts.output(m, flat, out).view(shape)


def gdn_gates(m: Any, flat: Tensor) -> tuple[Tensor, Tensor]:
    """A GatedDeltaNet's per-head write strength (beta) and decay (g), as HF computes them."""
    beta = m.in_proj_b(flat).sigmoid()
    g = -m.A_log.float().exp() * F.softplus(m.in_proj_a(flat).float() + m.dt_bias)
    return beta, g


def gated_rmsnorm(x: Tensor, gate: Tensor, norm: Any) -> Tensor:
    """The gated RMSNorm after the delta rule, in plain torch ops for inductor to fuse:
    rmsnorm(x) * weight * silu(gate), in fp32, cast back once, as fla's FusedRMSNormGated
    computes it (HF's own class rounds to bf16 between the weight and the gate: a rounding
    apart). Plain ops because, with fla installed, transformers makes `m.norm` fla's
    Triton-kernel module, which is not for dynamo to trace."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * norm.weight.float()
    if getattr(norm, "bias", None) is not None:
        y = y + norm.bias.float()
    return (y * F.silu(gate.float())).to(x.dtype)


def gdn_output(m: Any, flat: Tensor, out: Tensor) -> Tensor:
    """A GatedDeltaNet's gated RMSNorm of the delta rule's output [1, T, heads, v], then its
    out_proj: [1, T, hidden]."""
    z = m.in_proj_z(flat).reshape(-1, m.head_v_dim)
    normed = gated_rmsnorm(out.reshape(-1, m.head_v_dim), z, m.norm)
    return m.out_proj(normed.reshape(1, flat.shape[1], -1))


def gated_deltanet_packed(
    module: Any, x: Tensor, bounds: DocBounds, parts: HybridLayerParts | None = None
) -> Tensor:
    """HF's Qwen3.5 GatedDeltaNet on a packed [B, S, H] input, documents kept apart: fla's
    kernels with the boundaries on CUDA, else each document alone through HF's own layer."""
    if x.device.type == "cuda" and fla_available():
        return gated_deltanet_fla(module, x, bounds, parts)
    return bounds.per_document(module, x)


def hybrid_layer_packed(
    layer: Any, hidden: Tensor, bounds: DocBounds, parts: HybridLayerParts | None = None
) -> Tensor:
    """One Qwen3.5 linear-attention decoder layer, as HF's, with the packed token mixer.
    `parts`: its elementwise pieces compiled (`target.compile`); fla's kernels stay eager."""
    norm_in = layer.input_layernorm if parts is None else parts.norm_in
    h = gated_deltanet_packed(layer.linear_attn, norm_in(hidden), bounds, parts)
    if parts is not None:
        return parts.residual_mlp(layer, hidden, h)
    return residual_mlp(layer, hidden, h)


def residual_mlp(layer: Any, residual: Tensor, mixed: Tensor) -> Tensor:
    """The second half of a decoder layer: the token mixer's residual, then the MLP's."""
    hidden = residual + mixed
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


class HybridLayerParts:
    """A Gated DeltaNet layer's elementwise-heavy pieces compiled (`target.compile`): its
    input RMSNorm; the gates (beta, g); the gated RMSNorm of the delta rule's output with
    out_proj; and the residuals with the post-attention RMSNorm and the SwiGLU MLP around
    the MLP's GEMMs. On the H200 the 27B shape's eager forward spent 14.5 of 50.8 ms (8
    layers) in unfused elementwise kernels (`bench/hybrid_forward.py --profile`). fla's
    kernels in between stay eager: their host-side chunk indexing varies with the row's
    documents and would recompile. Each piece sees one static shape per bucket, and dynamo
    shares one graph across the layers (their weights are graph inputs).

    The gated norm is `gated_rmsnorm`, not `m.norm`: a first try (12-04) compiled `m.norm`,
    fla's Triton-kernel module under transformers 5.17, and that run's loss left eager's
    trajectory (step 60: 6.92 against 6.13)."""

    def __init__(self, layer: Any) -> None:
        self.norm_in = torch.compile(layer.input_layernorm, dynamic=False)
        self.gates = torch.compile(gdn_gates, dynamic=False)
        self.output = torch.compile(gdn_output, dynamic=False)
        self.residual_mlp = torch.compile(residual_mlp, dynamic=False)


# -- full attention of a packed row without a dense mask ----------------------------------
#
# The boolean block-diagonal mask above makes SDPA leave its flash kernel: on the H200 the
# 8B target's packed forward took 2.3x its unpacked one (bench/README.md). torch's own
# `varlen_attn` (torch >= 2.10, its flash kernel, CUDA, bf16/fp16) takes the documents'
# boundaries instead (`cu_seqlens`): causal attention inside each document, nothing across.
# HF's attention layers call the function registered for `config._attn_implementation`
# ("sdpa"); `install_packed_attention` registers, under that same name, a function that runs
# varlen when the call carries the row's `dflash_docs` and HF's own SDPA function otherwise,
# so every other caller of the same modules (the held-out eval's KV-cached decode) is
# unchanged.


@dataclass
class PackedDocs:
    """A packed batch's documents as varlen attention takes them, over the flattened batch."""

    cu_seqlens: Tensor  # int32 [N + 1] on the target's device: each document's start, then B*S
    max_len: int  # the longest document (read on the host, where the batch was built)

    @classmethod
    def from_positions(cls, position_ids: Tensor, device: torch.device) -> PackedDocs:
        """From the batch's `position_ids` (a document starts where its position is 0, and
        at each row's first token). Given them on the host (the pipeline does), nothing
        waits on the GPU: the boundaries are found there and copied without blocking."""
        starts = position_ids == 0
        starts[:, 0] = True
        flat = starts.reshape(-1)
        first = flat.nonzero().flatten()  # a host sync when position_ids are on a GPU
        cu = torch.cat([first, first.new_tensor([flat.numel()])]).to(torch.int32)
        max_len = int((cu[1:] - cu[:-1]).max())
        if cu.device != device:
            if device.type == "cuda" and cu.device.type == "cpu":
                cu = cu.pin_memory()
            cu = cu.to(device, non_blocking=True)
        return cls(cu_seqlens=cu, max_len=max_len)


@functools.cache
def _varlen_parameters() -> frozenset[str] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


def varlen_supported(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when varlen attention can run here, else why not (one line)."""
    if device.type != "cuda":
        return f"varlen attention needs CUDA (the target is on {device})"
    if _varlen_parameters() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (torch >= 2.10)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"varlen attention's flash kernel takes bf16 or fp16, not {dtype}"
    if torch.cuda.get_device_capability(device)[0] < 8:
        return "varlen attention's flash kernel needs compute capability >= 8.0"
    return None


@torch.compiler.disable  # eager in a compiled layer: max_len varies per batch
def varlen_attention(
    query: Tensor, key: Tensor, value: Tensor, docs: PackedDocs, scaling: float | None
) -> Tensor:
    """HF's layout in ([B, Hq, S, D] q, [B, Hkv, S, D] k and v), HF's out ([B, S, Hq, D]):
    causal attention within each document of the flattened batch."""
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_parameters() or frozenset()
    B, Hq, S, D = query.shape
    Hkv = key.shape[1]
    q = query.transpose(1, 2).reshape(B * S, Hq, D)
    k = key.transpose(1, 2).reshape(B * S, Hkv, D)
    v = value.transpose(1, 2).reshape(B * S, Hkv, D)
    kw: dict[str, Any] = {}
    # torch 2.10 takes is_causal; later versions a window, (-1, 0) being causal.
    if "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        kw["is_causal"] = True
    if scaling is not None:
        if "scale" in params:
            kw["scale"] = scaling
        elif abs(scaling - D**-0.5) > 1e-12 * scaling:
            q = q * (scaling * D**0.5)
    if Hq != Hkv:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            k = k.repeat_interleave(Hq // Hkv, dim=1)
            v = v.repeat_interleave(Hq // Hkv, dim=1)
    cu = docs.cu_seqlens
    out = varlen_attn(q, k, v, cu, cu, docs.max_len, docs.max_len, **kw)
    assert isinstance(out, Tensor)  # no auxiliary outputs asked for
    return out.view(B, S, Hq, D)


# The packed kernels by name: bench/gpu_bench.py adds its own to compare (flex).
PACKED_KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Any, float | None], Tensor]] = {
    "varlen": varlen_attention,
}


def install_packed_attention() -> None:
    """Register, as HF's "sdpa" attention function, one that runs a packed kernel for a
    call carrying `dflash_docs` (and `dflash_kernel`), grouped-query attention for a call
    carrying `dflash_grouped_query` (the eval's verify, targets/grouped_attention.py), and
    HF's own SDPA function for any other call, unchanged. Once per process; idempotent."""
    from transformers import AttentionInterface

    from trainer.targets.grouped_attention import grouped_or

    current: Any = AttentionInterface._global_mapping["sdpa"]
    if getattr(current, "dflash_packed", False):
        return

    def sdpa_or_packed(
        module: Any,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        *args: Any,
        dflash_docs: Any = None,
        dflash_kernel: str = "varlen",
        dflash_grouped_query: bool = False,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        if dflash_grouped_query and not args:  # the held-out eval's masked verify
            return grouped_or(current, module, query, key, value, attention_mask, **kwargs)
        if dflash_docs is None:
            return current(module, query, key, value, attention_mask, *args, **kwargs)
        kernel = PACKED_KERNELS[dflash_kernel]
        return kernel(query, key, value, dflash_docs, kwargs.get("scaling")), None

    sdpa_or_packed.dflash_packed = True  # type: ignore[attr-defined]
    AttentionInterface.register("sdpa", sdpa_or_packed)
