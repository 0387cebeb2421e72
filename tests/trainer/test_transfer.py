"""What a target hands to a drafter on the same GPU must all be marked in use on the
drafter's stream: every tensor, including those flex_attention's mask_mod closes over."""

from __future__ import annotations

import torch

from trainer.data.samples import Batch
from trainer.model.step import attach_mask, prepare_blocks
from trainer.runtime.transfer import tensors_in


def test_every_tensor_of_a_handed_over_item_is_found():
    ids = torch.arange(256).view(1, 256)
    batch = Batch(input_ids=ids, loss_mask=torch.ones(1, 256), lengths=torch.tensor([256]), index=0)
    blocks = attach_mask(prepare_blocks(batch, 8, 0, 0), "flex", 16)
    features = torch.randn(1, 256, 32)
    found = {id(t) for t in tensors_in((blocks, features))}
    expected = [features, ids, batch.loss_mask, batch.lengths, blocks.anchors, blocks.keep]
    assert all(id(t) in found for t in expected)
    # The block mask's own index tensors too (kv_num_blocks, kv_indices, ...).
    mask_tensors = [v for v in vars(blocks.mask).values() if isinstance(v, torch.Tensor)]
    assert mask_tensors and all(id(t) in found for t in mask_tensors)


def test_walking_stops_at_plain_values_and_cycles():
    class Node:
        def __init__(self) -> None:
            self.t = torch.zeros(1)
            self.me = self  # a cycle: the depth limit ends the walk

    node = Node()
    found = tensors_in([node, 3, "x", None])
    assert found and all(t is node.t for t in found)
