"""Anchors, block contents, labels and loss weights."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.model.blocks import (
    block_labels_and_weights,
    block_positions,
    block_token_ids,
    default_gamma,
    sample_anchors,
)


def test_anchors_lie_in_the_loss_mask_sorted_and_padded():
    loss_mask = torch.zeros(3, 40)
    loss_mask[0, 10:30] = 1
    loss_mask[1, 35:40] = 1  # position 39 has no label after it: never an anchor
    loss_mask[2, 5:7] = 1  # only 2 valid positions for 8 anchors: the rest is padding
    lengths = torch.tensor([40, 40, 30])
    g = torch.Generator().manual_seed(0)
    anchors, keep = sample_anchors(loss_mask, lengths, 8, g)
    assert anchors.shape == keep.shape == (3, 8)
    assert keep[0].all() and keep[1, :4].all() and not keep[1, 4:].any()
    assert keep[2, :2].all() and not keep[2, 2:].any()
    for b in range(3):
        kept = anchors[b][keep[b]]
        assert torch.equal(kept, kept.sort().values)
        assert len(set(kept.tolist())) == len(kept)
        assert all(loss_mask[b, a] == 1 and a + 1 < lengths[b] for a in kept.tolist())
    assert anchors[~keep].eq(0).all()
    assert set(anchors[1][keep[1]].tolist()) == {35, 36, 37, 38}


def test_anchor_sampling_is_seeded():
    loss_mask = torch.ones(2, 200)
    lengths = torch.tensor([200, 150])

    def draw(seed):
        return sample_anchors(loss_mask, lengths, 16, torch.Generator().manual_seed(seed))[0]

    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_block_tokens_and_positions():
    ids = torch.arange(100, 120)[None]
    anchors = torch.tensor([[2, 7]])
    blocks = block_token_ids(ids, anchors, 4, mask_token_id=999)
    assert blocks.tolist() == [[102, 999, 999, 999, 107, 999, 999, 999]]
    assert block_positions(anchors, 4).tolist() == [[2, 3, 4, 5, 7, 8, 9, 10]]


def test_labels_and_weights_follow_the_formula():
    S, bs, gamma = 12, 4, 7.0
    ids = torch.arange(50, 50 + S)[None]
    loss_mask = torch.ones(1, S)
    loss_mask[0, 5] = 0
    anchors = torch.tensor([[3, 10, 0]])
    keep = torch.tensor([[True, True, False]])
    labels, w = block_labels_and_weights(ids, loss_mask, anchors, keep, bs, gamma)
    labels, w = labels.view(3, bs), w.view(3, bs)
    # Block position k predicts input_ids[a + k].
    assert labels[0].tolist() == [53, 54, 55, 56]
    assert labels[1, :2].tolist() == [60, 61]
    decay = [0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, bs)]
    # k=0 no loss; position 5 is outside the loss mask.
    assert w[0].tolist() == pytest.approx([0.0, decay[1], 0.0, decay[3]])
    # a + k >= S is beyond the sequence: no loss.
    assert w[1].tolist() == pytest.approx([0.0, decay[1], 0.0, 0.0])
    assert w[2].eq(0).all()  # padded block


def test_default_gamma_is_dflash_s():
    assert default_gamma(16) == 7.0
    assert default_gamma(10) == 5.0
    assert default_gamma(8) == 4.0
