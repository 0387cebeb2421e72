"""A drafter over a loaded tiny target, with weights large enough that predictions differ
clearly between positions (the 0.02 init makes them nearly uniform); and a drafter's shape
over any target (`arch_for`)."""

from __future__ import annotations

import torch

from trainer.model.drafter import DFlashDrafter, DrafterArch
from trainer.targets.load import LoadedTarget, TargetInfo


def arch_for(
    i: TargetInfo, layer_ids: list[int], mask_id: int, block_size: int, num_layers: int = 2
) -> DrafterArch:
    """A drafter's shape over the target `i`, reading its layers `layer_ids`."""
    return DrafterArch(
        hidden_size=i.hidden_size,
        num_layers=num_layers,
        num_heads=i.num_heads,
        num_kv_heads=i.num_kv_heads,
        head_dim=i.head_dim,
        intermediate_size=i.intermediate_size,
        vocab_size=i.vocab_size,
        rms_norm_eps=i.rms_norm_eps,
        rope_theta=i.rope_theta,
        block_size=block_size,
        mask_token_id=mask_id,
        target_layer_ids=tuple(layer_ids),
    )


def tiny_drafter(
    target: LoadedTarget, mask_id: int, block_size: int, num_layers: int = 2
) -> DFlashDrafter:
    arch = arch_for(target.info, target.layer_ids, mask_id, block_size, num_layers)
    torch.manual_seed(0)
    drafter = DFlashDrafter(arch, target.embed_weight, target.lm_head_weight)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad and p.dim() == 2:
                p.normal_(0, 0.2)
    return drafter
