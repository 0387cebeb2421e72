"""Packing: every sample placed once, rows isolated, and a pack trains exactly as its
documents would one at a time."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_drafter import tiny_drafter

from trainer.builtins.resolve import resolve_data_path
from trainer.data.packing import (
    collate_packs,
    epoch_pack_batches,
    packed_batches_per_epoch,
    plan_packs,
)
from trainer.data.samples import Batch, Sample, load_samples
from trainer.model.blocks import sample_anchors
from trainer.model.step import BlockBatch, LossSettings, drafter_loss
from trainer.targets.load import (
    default_target_layer_ids,
    load_target,
    load_tokenizer,
    read_target_info,
)

BS = 8


def fake(lengths: list[int]) -> list[Sample]:
    return [Sample(input_ids=[7] * n, loss_mask=[1] * n) for n in lengths]


def test_every_sample_is_placed_once_and_rows_fit() -> None:
    rng = random.Random(0)
    lengths = [max(2, int(rng.lognormvariate(5.5, 1.0))) for _ in range(3000)]
    lengths = [min(n, 4096) for n in lengths]
    rows = plan_packs(lengths, list(range(len(lengths))), 4096)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 4096 for row in rows)
    # Best fit leaves little room: only the last rows are part-filled.
    padding = 1 - sum(lengths) / (len(rows) * 4096)
    assert padding < 0.02, padding


def test_a_sample_longer_than_the_row_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="5000 tokens exceeds the row of 4096"):
        plan_packs([10, 5000], [0, 1], 4096)


def test_epochs_differ_in_order_not_in_count() -> None:
    samples = fake([random.Random(i).randint(2, 300) for i in range(400)])
    per_epoch = packed_batches_per_epoch(samples, [256, 1024], 3)
    seen = []
    for epoch in range(3):
        batches = epoch_pack_batches(samples, [256, 1024], 3, seed=5, epoch=epoch)
        assert len(batches) == per_epoch
        assert all(len(b) == 3 for b in batches)
        placed = {i for b in batches for row in b for i in row}
        assert placed == set(range(400))  # nothing dropped (top-ups may repeat rows)
        seen.append(batches)
    assert seen[0] != seen[1]
    assert seen[0] == epoch_pack_batches(samples, [256, 1024], 3, seed=5, epoch=0)


def test_collate_marks_documents_and_restarts_positions() -> None:
    samples = [
        Sample([1, 2, 3], [0, 1, 1]),
        Sample([4, 5], [1, 1]),
        Sample([6, 7, 8, 9], [0, 0, 1, 1]),
    ]
    batch = collate_packs(samples, [[0, 1], [2]], bucket_len=6, pad_id=0, index=3)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert batch.doc_ids is not None and batch.position_ids is not None
    assert batch.doc_ids.tolist() == [[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, -1, -1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]
    assert batch.lengths.tolist() == [5, 4]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]]


def test_anchors_need_their_next_token_in_the_same_document() -> None:
    samples = [Sample([1, 2, 3], [1, 1, 1]), Sample([4, 5, 6], [1, 1, 1])]
    batch = collate_packs(samples, [[0, 1]], bucket_len=8, pad_id=0, index=0)
    anchors, keep = sample_anchors(batch.loss_mask, batch.lengths, 8, doc_ids=batch.doc_ids)
    assert sorted(anchors[keep].tolist()) == [0, 1, 3, 4]  # not 2, 5: their documents end


# -- a pack trains exactly as its documents one at a time ---------------------------------
@pytest.fixture(scope="module", params=["qwen3", "qwen3.5-hybrid"])
def tiny(request):
    """Both target families: Qwen3 (full attention) and the Qwen3.5 hybrid (Gated DeltaNet
    layers carry state along the row: the packed forward must cut it at each document)."""
    name = "tiny_target_dir" if request.param == "qwen3" else "tiny_hybrid_target_dir"
    target_dir = request.getfixturevalue(name)
    tok, mask_id = load_tokenizer(target_dir, "<|MASK|>")
    info = read_target_info(target_dir)
    layer_ids = default_target_layer_ids(info.num_layers, 2)
    target = load_target(target_dir, layer_ids, torch.float32, torch.device("cpu"))
    drafter = tiny_drafter(target, mask_id, BS).train()
    return tok, target, drafter


SETTINGS = LossSettings(
    backend="sdpa", block_size=BS, gamma=7.0, chunk_blocks=4, topk=4, impl="fused"
)


def _one_at_a_time(samples, anchors_by_doc, target, drafter):
    """The documents as rows of their own (each padded to the longest), their anchors moved
    to each row's start: the reference a pack must reproduce."""
    k = len(samples)
    S = max(len(s.input_ids) for s in samples)
    N = max(len(a) for a in anchors_by_doc)
    ids = torch.zeros(k, S, dtype=torch.int64)
    mask = torch.zeros(k, S)
    anchors = torch.zeros(k, N, dtype=torch.int64)
    keep = torch.zeros(k, N, dtype=torch.bool)
    for d, (s, a) in enumerate(zip(samples, anchors_by_doc, strict=True)):
        n = len(s.input_ids)
        ids[d, :n] = torch.tensor(s.input_ids)
        mask[d, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        anchors[d, : len(a)] = torch.tensor(a)
        keep[d, : len(a)] = True
    lengths = torch.tensor([len(s.input_ids) for s in samples])
    # Each document's features from its own forward: the target sees one document.
    feats = torch.zeros(k, S, target.features(ids[:1, :1]).shape[-1])
    for d, s in enumerate(samples):
        n = len(s.input_ids)
        feats[d, :n] = target.features(ids[d : d + 1, :n])[0]
    batch = Batch(input_ids=ids, loss_mask=mask, lengths=lengths, index=0)
    return BlockBatch(batch=batch, anchors=anchors, keep=keep, epoch=0), feats


def _loss_and_grads(drafter, blocks, feats):
    drafter.zero_grad(set_to_none=True)
    out = drafter_loss(drafter, blocks, feats, SETTINGS)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("dataset", ["builtin:synthetic-chat", "builtin:synthetic-text"])
def test_a_pack_trains_as_its_documents_one_at_a_time(tiny, dataset):
    tok, target, drafter = tiny
    samples, _ = load_samples(resolve_data_path(dataset), tok, "auto", 256)
    docs = [samples[i] for i in (0, 1, 2, 3)]  # different lengths, loss masks
    bucket = sum(len(s.input_ids) for s in docs) + 5  # some padding at the end
    batch = collate_packs(docs, [[0, 1, 2, 3]], bucket, pad_id=0, index=0)
    g = torch.Generator().manual_seed(3)
    anchors, keep = sample_anchors(batch.loss_mask, batch.lengths, 24, g, batch.doc_ids)
    assert keep.sum() >= 12
    assert batch.position_ids is not None and batch.doc_ids is not None
    # The whole chain as the pipeline runs it: the target's packed forward, then the drafter.
    feats = target.features(batch.input_ids, batch.position_ids)
    starts, at = [], 0
    for s in docs:
        starts.append(at)
        at += len(s.input_ids)
    packed = BlockBatch(batch=batch, anchors=anchors, keep=keep, epoch=0)
    by_doc: list[list[int]] = [[] for _ in docs]
    for a in anchors[keep].tolist():
        d = int(batch.doc_ids[0, a])
        by_doc[d].append(a - starts[d])
    alone, alone_feats = _one_at_a_time(docs, by_doc, target, drafter)

    out_p, grads_p = _loss_and_grads(drafter, packed, feats)
    out_a, grads_a = _loss_and_grads(drafter, alone, alone_feats)
    torch.testing.assert_close(out_p.loss, out_a.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_p.stats, out_a.stats, rtol=0, atol=0)
    assert grads_p.keys() == grads_a.keys() and grads_p
    for name in grads_p:
        torch.testing.assert_close(grads_p[name], grads_a[name], rtol=1e-4, atol=1e-6)


def test_without_document_isolation_the_pack_differs(tiny):
    """The same comparison fails when the row is treated as one document: the test can fail."""
    tok, target, drafter = tiny
    samples, _ = load_samples(resolve_data_path("builtin:synthetic-chat"), tok, "auto", 256)
    docs = [samples[i] for i in (0, 1)]
    batch = collate_packs(docs, [[0, 1]], sum(len(s.input_ids) for s in docs), 0, 0)
    g = torch.Generator().manual_seed(3)
    anchors, keep = sample_anchors(batch.loss_mask, batch.lengths, 16, g, batch.doc_ids)
    feats = target.features(batch.input_ids)
    isolated = BlockBatch(batch=batch, anchors=anchors, keep=keep, epoch=0)
    leaky_batch = Batch(batch.input_ids, batch.loss_mask, batch.lengths, 0)
    leaky = BlockBatch(batch=leaky_batch, anchors=anchors, keep=keep, epoch=0)
    a = drafter_loss(drafter, isolated, feats, SETTINGS).loss
    b = drafter_loss(drafter, leaky, feats, SETTINGS).loss
    assert not torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_loss_weights_end_at_the_document() -> None:

    samples = [Sample([5] * 4, [1] * 4), Sample([6] * 4, [1] * 4)]
    batch = collate_packs(samples, [[0, 1]], 8, 0, 0)
    from trainer.model.blocks import block_labels_and_weights

    anchors = torch.tensor([[2]])
    keep = torch.tensor([[True]])
    _, w = block_labels_and_weights(
        batch.input_ids, batch.loss_mask, anchors, keep, BS, 7.0, batch.doc_ids
    )
    assert (w[0, :2] > 0).tolist() == [False, True]  # only a+1 = 3 is in document 0
    assert not w[0, 2:].any()


def test_flex_and_dense_masks_agree_on_a_pack() -> None:
    from torch.nn.attention.flex_attention import create_mask

    from trainer.model.attention import dense_dflash_mask, dflash_mask_mod

    samples = [Sample([1] * n, [1] * n) for n in (5, 9, 3, 7)]
    batch = collate_packs(samples, [[0, 1], [2, 3]], 16, 0, 0)
    g = torch.Generator().manual_seed(1)
    anchors, keep = sample_anchors(batch.loss_mask, batch.lengths, 6, g, batch.doc_ids)
    dense = dense_dflash_mask(anchors, keep, 16, 4, batch.doc_ids)
    mod = dflash_mask_mod(anchors, keep, 16, 4, batch.doc_ids)
    flex = create_mask(mod, 2, None, 6 * 4, 16 + 6 * 4, device="cpu")[:, 0]
    assert torch.equal(dense, flex)
    # And the document condition matters here: without it, blocks see other documents.
    assert not torch.equal(dense, dense_dflash_mask(anchors, keep, 16, 4))
