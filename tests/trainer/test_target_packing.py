"""Packed rows through the target: each document's features equal the document run alone."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from trainer.targets.load import load_target
from trainer.targets.packing import (
    PACKED_KERNELS,
    DocBounds,
    PackedDocs,
    install_packed_attention,
)

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


def test_packed_docs_from_host_positions():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1], [5, 6, 0, 1, 2, 3, 0]])
    docs = PackedDocs.from_positions(pos, CPU)
    assert docs.cu_seqlens.dtype == torch.int32
    assert docs.cu_seqlens.tolist() == [0, 3, 5, 7, 9, 13, 14]
    assert docs.max_len == 4


def _reference_kernel(calls: list[int]):
    """What varlen computes (causal attention inside each document of the flattened batch),
    one document at a time through SDPA, in HF's layouts: the CPU stand-in for the CUDA
    kernel, so the plumbing around it runs on the real tiny targets here."""

    def kernel(query, key, value, docs, scaling):
        calls.append(1)
        B, Hq, S, D = query.shape
        q = query.transpose(1, 2).reshape(B * S, Hq, D)
        k = key.transpose(1, 2).reshape(B * S, key.shape[1], D)
        v = value.transpose(1, 2).reshape(B * S, key.shape[1], D)
        out = torch.empty_like(q)
        cu = docs.cu_seqlens.tolist()
        for a, b in itertools.pairwise(cu):
            o = F.scaled_dot_product_attention(
                q[a:b].transpose(0, 1),
                k[a:b].transpose(0, 1),
                v[a:b].transpose(0, 1),
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            out[a:b] = o.transpose(0, 1)
        return out.view(B, S, Hq, D)

    return kernel


@pytest.mark.parametrize("form", ["tiny_target_dir", "tiny_hybrid_target_dir"])
def test_packed_kernel_path_equals_each_document_alone(form, request, monkeypatch):
    """The varlen path (HF's full-attention layers handed the documents' boundaries through
    the registered attention function) with the reference kernel in varlen's place: each
    document's features are those of the document alone, and the kernel ran once per
    full-attention layer. Without the kernel, attention would run causal over the whole
    row and the documents would leak into each other."""
    t = load_target(request.getfixturevalue(form), [1, 3, 6, 7], torch.float32, CPU)
    f = t.features
    calls: list[int] = []
    monkeypatch.setitem(PACKED_KERNELS, "reference", _reference_kernel(calls))
    install_packed_attention()
    monkeypatch.setattr(f, "packed_attention", "varlen")
    monkeypatch.setattr(f, "packed_kernel", "reference")
    docs, ids, pos = _packed_batch(0)
    packed = f(ids, pos, f.packed_docs(pos, CPU))
    full_layers = sum(not linear for linear in f.linear)
    assert len(calls) == full_layers > 0
    for r, row in enumerate(docs):
        start = 0
        for k, doc in enumerate(row):
            alone = f(doc[None])[0]
            if not (r == 0 and k == len(row) - 1):  # padding: never read
                got = packed[r, start : start + len(doc)]
                torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
            start += len(doc)


def test_the_registered_function_is_hf_sdpa_for_every_other_call(tiny_target_dir):
    """Installed once per process as HF's "sdpa": a call without a packed row's boundaries
    (the unpacked path, the held-out eval's decode) is HF's own SDPA function, bit for bit."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    install_packed_attention()
    fn = AttentionInterface._global_mapping["sdpa"]
    assert getattr(fn, "dflash_packed", False)
    t = load_target(tiny_target_dir, [1, 3], torch.float32, CPU)
    module = t.model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 9, 16, generator=g)
    k = torch.randn(2, 2, 9, 16, generator=g)
    v = torch.randn(2, 2, 9, 16, generator=g)
    mask = torch.rand(2, 1, 9, 9, generator=g) > 0.3
    mask[..., 0] = True
    for m in (None, mask):
        got, _ = fn(module, q, k, v, m, dropout=0.0, scaling=0.25)
        want, _ = sdpa_attention_forward(module, q, k, v, m, dropout=0.0, scaling=0.25)
        assert torch.equal(got, want)


def test_compiled_gated_deltanet_pieces_equal_hf_s(tiny_hybrid_target_dir):
    """The pieces HybridLayerParts compiles around fla's kernels: the gates exactly, and the
    plain-torch gated RMSNorm + out_proj as HF's own norm module computes them (bf16, one
    rounding apart), for every Gated DeltaNet layer, with one graph each across the layers."""
    from torch._dynamo.utils import counters

    from trainer.targets.packing import HybridLayerParts, gdn_gates

    f = load_target(
        tiny_hybrid_target_dir, [1], torch.bfloat16, torch.device("cpu"), "mask"
    ).features
    linear = [layer for i, layer in enumerate(f.base.layers) if f.linear[i]]
    assert linear
    torch._dynamo.reset()
    graphs0 = int(counters["stats"]["unique_graphs"])
    g = torch.Generator().manual_seed(0)
    for layer in linear:
        m, parts = layer.linear_attn, HybridLayerParts(layer)
        flat = torch.randn(1, 48, m.in_proj_b.in_features, generator=g).bfloat16()
        out = torch.randn(1, 48, m.num_v_heads, m.head_v_dim, generator=g).bfloat16()
        for want, have in zip(gdn_gates(m, flat), parts.gates(m, flat), strict=True):
            assert torch.allclose(want.float(), have.float(), rtol=1e-6, atol=1e-6)
        z = m.in_proj_z(flat)
        normed = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))
        want = m.out_proj(normed.reshape(1, 48, -1)).float()
        have = parts.output(m, flat, out).float()
        assert float((have - want).norm() / want.norm()) < 1e-2
    assert int(counters["stats"]["unique_graphs"]) - graphs0 == 2  # shared across layers
