"""The DFlash mask, checked against a loop that states the rule literally, and the backends."""

from __future__ import annotations

import pytest
import torch

from trainer.model.attention import attend, dense_dflash_mask, make_block_mask, make_dense_mask


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


def _case(seed: int, packed: bool) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """Random anchors (sorted, some duplicated, some padded), a context that is not a whole
    number of flex tiles, and for a packed row documents of random lengths."""
    g = torch.Generator().manual_seed(seed)
    B, N, ctx = 2, 13, 300
    anchors = torch.randint(1, ctx - 1, (B, N), generator=g).sort(dim=1).values
    keep = torch.rand(B, N, generator=g) > 0.15
    anchors[~keep] = 0
    doc_ids = None
    if packed:
        lengths = torch.randint(5, 90, (B, 12), generator=g)
        doc_ids = torch.stack(
            [torch.repeat_interleave(torch.arange(12), lengths[b])[:ctx] for b in range(B)]
        )
        doc_ids = torch.nn.functional.pad(doc_ids, (0, ctx - doc_ids.shape[1]), value=11)
    return anchors, keep, ctx, doc_ids


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_structural_block_mask_covers_exactly_what_the_rule_allows(seed, packed):
    """The tiles built from the mask's structure: every tile holding an allowed pair is
    visited, a tile marked full holds only allowed pairs, and the attention equals SDPA's
    with the dense mask."""
    from trainer.model.attention import FLEX_TILE, dflash_tiles

    bs = 16
    anchors, keep, ctx, doc_ids = _case(seed, packed)
    dense = dense_dflash_mask(anchors, keep, ctx, bs, doc_ids)  # [B, Q, KV]
    B, Q, KV = dense.shape
    padded = torch.nn.functional.pad(dense, (0, -KV % FLEX_TILE, 0, -Q % FLEX_TILE))
    tiles = padded.view(B, -1, FLEX_TILE, padded.shape[2] // FLEX_TILE, FLEX_TILE)
    any_allowed = tiles.any(dim=4).any(dim=2)
    # A tile is all-allowed only if it lies wholly inside the real Q x KV.
    inside = torch.nn.functional.pad(
        torch.ones(B, Q, KV, dtype=torch.bool), (0, -KV % 128, 0, -Q % 128)
    )
    inside = inside.view_as(tiles).all(dim=4).all(dim=2)
    all_allowed = tiles.all(dim=4).all(dim=2) & inside
    partial, full = dflash_tiles(anchors, keep, ctx, bs, doc_ids)
    assert not (any_allowed & ~(partial | full)).any()  # nothing allowed is skipped
    assert not (full & ~all_allowed).any()  # the mask is skipped only where all is allowed
    assert not (partial & full).any()
    # Every anchor kept and past two whole tiles: those tiles are full for a whole query tile.
    late = torch.full_like(anchors, 290)
    late_full, _ = dflash_tiles(late, torch.ones_like(keep), ctx, bs)[::-1]
    assert late_full[:, 0, :2].all() and not late_full[:, :, 2:].any()  # tile 1 is padded
    # The same anchors in a second document starting at 200: no context tile is full.
    two_docs = (torch.arange(ctx) >= 200).long().expand(anchors.shape[0], ctx)
    split_partial, split_full = dflash_tiles(late, torch.ones_like(keep), ctx, bs, two_docs)
    assert not split_full.any() and split_partial[:, 0, 1:3].all()

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, Q, 32, generator=g)
    k = torch.randn(B, 2, KV, 32, generator=g)
    v = torch.randn(B, 2, KV, 32, generator=g)
    sdpa = attend(q, k, v, make_dense_mask(anchors, keep, ctx, bs, doc_ids))
    flex = attend(q, k, v, make_block_mask(anchors, keep, ctx, bs, doc_ids))
    torch.testing.assert_close(flex, sdpa, rtol=1e-4, atol=1e-5)
