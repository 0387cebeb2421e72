"""The DFlash drafter: a few Qwen3-style layers that denoise a block of 16 tokens at once.

Read top to bottom:
  1. `fuse_context`: the chosen target layers' hidden states, concatenated, projected
     `fc: n*H -> H` and RMS-normed: one context vector per target position.
  2. Each layer's attention takes Q from the block tokens only, and K/V from
     `[context ; block tokens]` ("KV injection"); q and k get per-head RMSNorm, then RoPE.
  3. A final RMSNorm, then the *target's* frozen lm_head.

The token embedding and lm_head are the target's, frozen; only fc, the norms and the layers
train. Positions: context 0..S-1, block tokens anchor + k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.model.attention import attend
from trainer.model.vocab_logits import vocab_logits


@dataclass(frozen=True)
class DrafterArch:
    """Everything needed to rebuild the drafter (saved with every checkpoint)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DrafterArch:
        """What `to_dict` wrote (a checkpoint's `arch`)."""
        return cls(**{**d, "target_layer_ids": tuple(d["target_layer_ids"])})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 as Qwen3 does; bf16 variance loses the small-norm tokens.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin for integer positions [..., L] -> [..., L, head_dim] (HF's half-split layout)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    )
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, L, D]; cos/sin [B, L, D] or [L, D]."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class DFlashAttention(nn.Module):
    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, d
        self.q_proj = nn.Linear(h, arch.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, arch.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, arch.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(arch.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, arch.rms_norm_eps)
        self.k_norm = RMSNorm(d, arch.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_k: tuple[Tensor, Tensor],
        mask: Any,
    ) -> Tensor:
        B, Q, _ = x.shape
        d = self.head_dim
        q = self.q_norm(self.q_proj(x).view(B, Q, self.num_heads, d)).transpose(1, 2)
        # KV injection: keys and values see the target context followed by the block itself.
        kv_in = torch.cat([context, x], dim=1)
        KV = kv_in.shape[1]
        k = self.k_norm(self.k_proj(kv_in).view(B, KV, self.num_kv_heads, d)).transpose(1, 2)
        v = self.v_proj(kv_in).view(B, KV, self.num_kv_heads, d).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = apply_rope(k, *rope_k)
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.num_heads * d))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, arch: DrafterArch) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = DFlashAttention(arch)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = SwiGLU(arch.hidden_size, arch.intermediate_size)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_k: tuple[Tensor, Tensor],
        mask: Any,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_k, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, arch: DrafterArch, embed_weight: Tensor, lm_head_weight: Tensor) -> None:
        super().__init__()
        self.arch = arch
        n, h = len(arch.target_layer_ids), arch.hidden_size
        self.fc = nn.Linear(n * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, arch.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(arch) for _ in range(arch.num_layers))
        self.norm = RMSNorm(h, arch.rms_norm_eps)
        # The target's embedding and head: shared, frozen, never saved in drafter checkpoints.
        self.embed_weight = nn.Parameter(embed_weight.detach(), requires_grad=False)
        if lm_head_weight.data_ptr() == embed_weight.data_ptr():
            self.lm_head_weight = self.embed_weight  # tied embeddings stay tied
        else:
            self.lm_head_weight = nn.Parameter(lm_head_weight.detach(), requires_grad=False)
        if arch.mask_token_id >= embed_weight.shape[0]:
            raise ValueError(
                f"mask token id {arch.mask_token_id} is outside the target's embedding "
                f"({embed_weight.shape[0]} rows); set drafter.mask_token to a reserved token"
            )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def trainable_state_dict(self) -> dict[str, Tensor]:
        keep = {name for name, p in self.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.state_dict().items() if k in keep}

    def embed(self, token_ids: Tensor) -> Tensor:
        return F.embedding(token_ids, self.embed_weight)

    def fuse_context(self, target_hidden: Tensor) -> Tensor:
        """[B, S, n*H] concatenated target layers -> [B, S, H] context vectors."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(
        self,
        block_ids: Tensor,
        block_positions: Tensor,
        context: Tensor,
        mask: Any,
        context_positions: Tensor | None = None,
    ) -> Tensor:
        """block_ids/positions [B, Q]; context [B, S, H] (fused). Returns normed hidden [B, Q, H].

        `mask` is the backend's mask (see trainer.model.attention); None lets every block token see
        the whole context, which is what inference does with a context that ends before the
        anchor. `context_positions` [B, S]: the context's RoPE positions (a packed row's
        restart at each document); None = 0..S-1.
        """
        B, S = context.shape[:2]
        x = self.embed(block_ids).to(context.dtype)
        d, theta = self.arch.head_dim, self.arch.rope_theta
        rope_q = rope_cos_sin(block_positions, d, theta)
        ctx_pos = context_positions
        if ctx_pos is None:
            ctx_pos = torch.arange(S, device=context.device).expand(B, S)
        rope_k = rope_cos_sin(torch.cat([ctx_pos, block_positions], dim=1), d, theta)
        rope_q = (rope_q[0].to(x.dtype), rope_q[1].to(x.dtype))
        rope_k = (rope_k[0].to(x.dtype), rope_k[1].to(x.dtype))
        for layer in self.layers:
            x = layer(x, context, rope_q, rope_k, mask)
        return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        return vocab_logits(hidden, self.lm_head_weight)
