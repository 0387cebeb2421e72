"""Packed rows through the target: each document's features equal the document run alone."""

from __future__ import annotations

import pytest
import torch

from trainer.targets.load import load_target
from trainer.targets.packing import DocBounds

CPU = torch.device("cpu")


def test_doc_bounds_from_positions():
    # Row 0: documents of 3 and 2 tokens, then 2 padding tokens continuing as their own run.
    # Row 1: a row that does not start at position 0 still starts a document.
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1], [5, 6, 0, 1, 2, 3, 0]])
    b = DocBounds.from_positions(pos)
    assert b.row_doc.tolist() == [[0, 0, 0, 1, 1, 2, 2], [3, 3, 4, 4, 4, 4, 5]]
    assert b.offset.tolist() == [0, 1, 2, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 0]
    assert b.lengths.tolist() == [3, 2, 2, 2, 4, 1]
    assert b.cu_seqlens().tolist() == [0, 3, 5, 7, 9, 13, 14]
    m = b.attention_mask()
    assert m.shape == (2, 1, 7, 7)
    assert m[0, 0, 4].tolist() == [False, False, False, True, True, False, False]
    assert m[1, 0, 5].tolist() == [False, False, True, True, True, True, False]
    # Longest first; a group padded to its longest holds <= 1.25x its own tokens.
    assert b.groups() == [[4, 0], [1, 2, 3, 5]]
    x = torch.randn(2, 7, 3)
    seen: list[torch.Tensor] = []

    def fn(batch):
        seen.append(batch)
        return batch.cumsum(1)  # causal, like the layers it stands for

    out = b.per_document(fn, x)
    assert [tuple(t.shape) for t in seen] == [(2, 4, 3), (4, 2, 3)]
    assert torch.equal(seen[0][0], x[1, 2:6]) and torch.equal(seen[0][1, :3], x[0, :3])
    assert torch.equal(seen[0][1, 3], torch.zeros(3))  # right padding: zeros
    for r, c0, c1 in [(0, 0, 3), (0, 3, 5), (0, 5, 7), (1, 0, 2), (1, 2, 6), (1, 6, 7)]:
        torch.testing.assert_close(out[r, c0:c1], x[r, c0:c1].cumsum(0))


# Documents longer than the Gated DeltaNet's 64-token chunk, and shorter than its conv.
ROWS = [[5, 70, 23, 2], [40, 60]]  # the 2 at the end of row 0: padding, as its own run


def _packed_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    docs = [[torch.randint(4, 300, (n,), generator=g) for n in row] for row in ROWS]
    ids = torch.stack([torch.cat(row) for row in docs])
    pos = torch.stack([torch.cat([torch.arange(len(d)) for d in row]) for row in docs])
    return docs, ids, pos


@pytest.mark.parametrize("form", ["tiny_target_dir", "tiny_hybrid_target_dir"])
def test_packed_row_equals_each_document_alone(form, request):
    folder = request.getfixturevalue(form)
    t = load_target(folder, [1, 3, 6, 7], torch.float32, CPU)
    docs, ids, pos = _packed_batch(0)
    packed = t.features(ids, pos)
    leaky = t.features(ids)  # the same rows, boundaries not given
    for r, row in enumerate(docs):
        start = 0
        for k, doc in enumerate(row):
            alone = t.features(doc[None])[0]
            got = packed[r, start : start + len(doc)]
            if not (r == 0 and k == len(row) - 1):  # padding: never read
                torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
            if start > 0 and len(doc) > 4:
                # The check can fail: without boundaries a later document differs.
                assert (leaky[r, start : start + len(doc)] - alone).abs().max() > 1e-2
            start += len(doc)


@pytest.mark.parametrize("form", ["tiny_target_dir", "tiny_hybrid_target_dir"])
def test_one_document_per_row_matches_the_unpacked_path(form, request):
    t = load_target(request.getfixturevalue(form), [2, 5], torch.float32, CPU)
    ids = torch.randint(4, 300, (2, 90), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(90).expand(2, -1)
    torch.testing.assert_close(t.features(ids, pos), t.features(ids), rtol=1e-5, atol=1e-5)
