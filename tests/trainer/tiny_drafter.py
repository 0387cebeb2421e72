"""Drafters over a tiny target: its shape (`arch_over`), and one with weights large enough that
predictions differ clearly between positions (`tiny_drafter`; the 0.02 init makes them nearly
uniform)."""

from __future__ import annotations

import torch

from trainer.model.drafter import DFlashDrafter, DrafterArch
from trainer.targets.load import LoadedTarget, TargetInfo


def arch_over(
    info: TargetInfo, layer_ids: list[int] | tuple[int, ...], block_size: int, mask_id: int,
    num_layers: int = 2,
) -> DrafterArch:  # fmt: skip
    """A drafter's shape over a tiny target: its widths, heads and vocabulary."""
    return DrafterArch(
        hidden_size=info.hidden_size,
        num_layers=num_layers,
        num_heads=info.num_heads,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        intermediate_size=info.intermediate_size,
        vocab_size=info.vocab_size,
        rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta,
        block_size=block_size,
        mask_token_id=mask_id,
        target_layer_ids=tuple(layer_ids),
    )


def tiny_drafter(
    target: LoadedTarget, mask_id: int, block_size: int, num_layers: int = 2
) -> DFlashDrafter:
    arch = arch_over(target.info, target.layer_ids, block_size, mask_id, num_layers)
    torch.manual_seed(0)
    drafter = DFlashDrafter(arch, target.embed_weight, target.lm_head_weight)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad and p.dim() == 2:
                p.normal_(0, 0.2)
    return drafter
