"""Inference-style drafting: what the drafter proposes for a prefix, the way serving does it.

Kept deliberately independent of the training mask: the target runs on the prefix alone, the
context is exactly the positions before the anchor, and attention is unmasked. The training
path must predict the same tokens; the test that checks it catches label offsets and `<=`
in the mask, the two bugs that silently wreck acceptance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.model.drafter import DFlashDrafter
from trainer.targets.load import TargetFeatures


@torch.no_grad()
def draft_block_logits(drafter: DFlashDrafter, target: TargetFeatures, prefix: Tensor) -> Tensor:
    """prefix int64 [P] (P >= 1): tokens up to and including the last accepted one.

    The target has already processed prefix[:-1]; prefix[-1] opens the block at position P-1.
    Returns logits [bs, V]; row k proposes the token at position P-1+k (row 0 is unused).
    """
    bs = drafter.arch.block_size
    anchor = prefix.shape[0] - 1
    context_ids = prefix[:anchor][None]
    if anchor > 0:
        context = drafter.fuse_context(target(context_ids))
    else:
        context = drafter.embed_weight.new_zeros(1, 0, drafter.arch.hidden_size)
    block = torch.full((1, bs), drafter.arch.mask_token_id, dtype=torch.long)
    block[0, 0] = prefix[-1]
    positions = anchor + torch.arange(bs)[None]
    hidden = drafter(block.to(prefix.device), positions.to(prefix.device), context, None)
    return drafter.logits(hidden)[0].float()
