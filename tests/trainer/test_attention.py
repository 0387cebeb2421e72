"""The DFlash mask, checked against a loop that states the rule literally, and the backends."""

from __future__ import annotations

import pytest
import torch

from trainer.attention import attend, dense_dflash_mask, make_block_mask, make_dense_mask


def reference_mask(anchors: list[list[int]], keep: list[list[bool]], ctx: int, bs: int):
    B, N = len(anchors), len(anchors[0])
    out = torch.zeros(B, N * bs, ctx + N * bs, dtype=torch.bool)
    for b in range(B):
        for q in range(N * bs):
            n = q // bs
            if not keep[b][n]:
                continue  # padded block: sees nothing
            for kv in range(ctx + N * bs):
                if kv < ctx:
                    out[b, q, kv] = kv < anchors[b][n]  # strictly before the anchor
                else:
                    out[b, q, kv] = (kv - ctx) // bs == n  # its own block, all of it
    return out


# Overlapping anchors (5, 6: blocks cover the same positions), an anchor at 1, a duplicate
# anchor, one near the end, and padded blocks.
ANCHORS = [[1, 5, 6, 40, 61, 0], [0, 3, 3, 50, 0, 0]]
KEEP = [[True, True, True, True, True, False], [True, True, True, True, False, False]]
CTX, BS = 64, 4


def test_dense_mask_matches_the_literal_rule():
    got = dense_dflash_mask(torch.tensor(ANCHORS), torch.tensor(KEEP), CTX, BS)
    assert got.shape == (2, 6 * BS, CTX + 6 * BS)
    assert torch.equal(got, reference_mask(ANCHORS, KEEP, CTX, BS))


def test_anchor_position_itself_is_not_visible():
    # The `<=` bug: the query block anchored at 5 must not see context position 5.
    m = dense_dflash_mask(torch.tensor([[5]]), torch.tensor([[True]]), 10, 4)
    assert m[0, :, :5].all()
    assert not m[0, :, 5:10].any()
    assert m[0, :, 10:14].all()


def test_padded_blocks_see_nothing_and_give_no_nan():
    torch.manual_seed(0)
    anchors, keep = torch.tensor(ANCHORS), torch.tensor(KEEP)
    q = torch.randn(2, 4, 6 * BS, 8, requires_grad=True)
    k = torch.randn(2, 2, CTX + 6 * BS, 8, requires_grad=True)
    v = torch.randn(2, 2, CTX + 6 * BS, 8, requires_grad=True)
    out = attend(q, k, v, make_dense_mask(anchors, keep, CTX, BS))
    assert not out.isnan().any()
    padded_rows = out[0, :, 5 * BS :]  # batch 0, block 5 is padding
    assert torch.equal(padded_rows, torch.zeros_like(padded_rows))
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    assert not (q.grad.isnan().any() or k.grad.isnan().any() or v.grad.isnan().any())
    assert torch.equal(q.grad[0, :, 5 * BS :], torch.zeros_like(q.grad[0, :, 5 * BS :]))


def test_sdpa_path_equals_explicit_softmax_attention():
    torch.manual_seed(1)
    anchors, keep = torch.tensor(ANCHORS), torch.tensor(KEEP)
    q = torch.randn(2, 4, 6 * BS, 8)
    k = torch.randn(2, 2, CTX + 6 * BS, 8)
    v = torch.randn(2, 2, CTX + 6 * BS, 8)
    mask = dense_dflash_mask(anchors, keep, CTX, BS)[:, None]
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = (q @ kk.transpose(-1, -2)) / 8**0.5
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
    expected = probs @ vv
    got = attend(q, k, v, make_dense_mask(anchors, keep, CTX, BS))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_flex_and_sdpa_agree_on_a_forward_pass(seed):
    """Compiled flex_attention (inductor's CPU kernel) against the dense-mask SDPA path."""
    g = torch.Generator().manual_seed(seed)
    B, N, bs, ctx = 2, 9, 16, 160
    # Random anchors plus the awkward cases: overlap, position 1, padding.
    anchors = torch.randint(1, ctx - 1, (B, N), generator=g).sort(dim=1).values
    anchors[0, :3] = torch.tensor([1, 20, 21])
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, -3:] = False
    anchors[1, -3:] = 0
    q = torch.randn(B, 4, N * bs, 32, generator=g)
    k = torch.randn(B, 2, ctx + N * bs, 32, generator=g)
    v = torch.randn(B, 2, ctx + N * bs, 32, generator=g)
    sdpa = attend(q, k, v, make_dense_mask(anchors, keep, ctx, bs))
    flex = attend(q, k, v, make_block_mask(anchors, keep, ctx, bs))
    assert not flex.isnan().any()
    torch.testing.assert_close(flex, sdpa, rtol=1e-4, atol=1e-5)
