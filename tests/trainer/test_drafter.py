"""The drafter: training-time predictions equal inference-time drafts, and what trains."""

from __future__ import annotations

import pytest
import torch
from tiny_drafter import tiny_drafter

from trainer.data.samples import Batch
from trainer.evaluation.draft import draft_block_logits
from trainer.model.attention import DenseMask, dense_dflash_mask
from trainer.model.blocks import block_labels_and_weights, block_positions, block_token_ids
from trainer.model.drafter import DFlashDrafter, DrafterArch
from trainer.model.step import BlockBatch, drafter_hidden
from trainer.targets.load import default_target_layer_ids, load_target, load_tokenizer

BS = 8


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    tok, mask_id = load_tokenizer(tiny_target_dir, "<|MASK|>")
    layer_ids = default_target_layer_ids(8, 2)
    target = load_target(tiny_target_dir, layer_ids, torch.float32, torch.device("cpu"))
    drafter = tiny_drafter(target, mask_id, BS).eval()
    text = "<|im_start|>user\ncount from 3 by 2<|im_end|>\n<|im_start|>assistant\n" + " ".join(
        str(3 + 2 * j) for j in range(30)
    )
    ids = torch.tensor(tok(text)["input_ids"])
    return target, drafter, ids


def training_logits(target, drafter, ids, anchors, keep, backend="sdpa", mask=None):
    S = ids.shape[0]
    batch = Batch(
        input_ids=ids[None],
        loss_mask=torch.ones(1, S),
        lengths=torch.tensor([S]),
        index=0,
    )
    blocks = BlockBatch(batch=batch, anchors=anchors, keep=keep, epoch=0)
    feats = target.features(ids[None])
    with torch.no_grad():
        if mask is None:
            hidden = drafter_hidden(drafter, blocks, feats, backend)
        else:  # a deliberately wrong mask, to show the test can fail
            ctx = drafter.fuse_context(feats)
            tok = block_token_ids(ids[None], anchors, BS, drafter.arch.mask_token_id)
            hidden = drafter(tok, block_positions(anchors, BS), ctx, mask)
    return drafter.logits(hidden)[0].view(anchors.shape[1], BS, -1)


# Overlapping anchors, an anchor at position 1, and a padded slot at the end.
ANCHORS = torch.tensor([[1, 12, 13, 20, 31, 0]])
KEEP = torch.tensor([[True, True, True, True, True, False]])


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_training_predictions_equal_inference_drafts(tiny, backend):
    target, drafter, ids = tiny
    logits = training_logits(target, drafter, ids, ANCHORS, KEEP, backend)
    labels, _ = block_labels_and_weights(
        ids[None], torch.ones(1, ids.shape[0]), ANCHORS, KEEP, BS, 7.0
    )
    labels = labels.view(-1, BS)
    for n, a in enumerate(ANCHORS[0].tolist()[:5]):
        draft = draft_block_logits(drafter, target.features, ids[: a + 1])
        # Rows 1..bs-1 propose tokens a+1..a+bs-1, the very tokens the training labels hold.
        torch.testing.assert_close(logits[n, 1:], draft[1:], rtol=1e-4, atol=1e-4)
        assert torch.equal(logits[n, 1:].argmax(-1), draft[1:].argmax(-1))
        end = min(a + BS, ids.shape[0])
        assert labels[n, 1 : end - a].tolist() == ids[a + 1 : end].tolist()


def test_a_mask_that_lets_blocks_see_their_anchor_is_caught(tiny):
    """The `<=` bug changes training predictions away from what inference drafts."""
    target, drafter, ids = tiny
    S = ids.shape[0]
    good = dense_dflash_mask(ANCHORS, KEEP, S, BS)
    leaky = good.clone()
    for n, a in enumerate(ANCHORS[0].tolist()[:5]):
        leaky[0, n * BS : (n + 1) * BS, a] = True  # kv <= anchor
    bad_mask = DenseMask(mask=leaky[:, None], empty_rows=~leaky[:, None].any(-1, keepdim=True))
    logits = training_logits(target, drafter, ids, ANCHORS, KEEP, mask=bad_mask)
    draft = draft_block_logits(drafter, target.features, ids[: 12 + 1])
    assert not torch.allclose(logits[1, 1:], draft[1:], rtol=1e-4, atol=1e-4)


def test_only_drafter_weights_train_and_are_saved(tiny):
    target, drafter, _ = tiny
    assert not drafter.embed_weight.requires_grad
    assert not drafter.lm_head_weight.requires_grad
    # Tied in the target, tied in the drafter: one tensor, not a copy.
    assert drafter.lm_head_weight.data_ptr() == target.embed_weight.data_ptr()
    saved = drafter.trainable_state_dict()
    assert "embed_weight" not in saved and "lm_head_weight" not in saved
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= set(saved)
    assert saved["fc.weight"].shape == (128, 2 * 128)
    q = saved["layers.0.self_attn.q_norm.weight"]
    assert q.shape == (drafter.arch.head_dim,)


def test_mask_token_outside_the_embedding_is_refused(tiny):
    target, drafter, _ = tiny
    arch = DrafterArch(**{**drafter.arch.to_dict(), "target_layer_ids": (1, 5)})
    too_big = DrafterArch(**{**arch.__dict__, "mask_token_id": target.embed_weight.shape[0]})
    with pytest.raises(ValueError, match="mask token id"):
        DFlashDrafter(too_big, target.embed_weight, target.lm_head_weight)
