"""The chunked loss: equal to the plain one, lm_head once per chunk, metrics from its logits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.model.loss import dflash_loss

V, H, BS = 97, 24, 4


class CountHeadMatmuls(TorchDispatchMode):
    """Counts every matmul whose output has the vocabulary as its last dim: lm_head calls."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        matmuls = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
        if func.overloadpacket in matmuls and out.shape[-1] == V:
            self.count += 1
        return out


def make_inputs(seed=0, B=2, N=6):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, N * BS, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (B, N * BS), generator=g)
    weights = torch.rand(B, N * BS, generator=g, dtype=torch.float64)
    weights.view(B, N, BS)[:, :, 0] = 0
    weights[1, -BS:] = 0  # a padded block
    return hidden, weight, labels, weights.float()


def plain_loss(hidden, weight, labels, weights):
    logits = hidden.reshape(-1, H) @ weight.t()
    ce = F.cross_entropy(logits.float(), labels.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum()


@pytest.mark.parametrize("impl", ["fused", "checkpoint"])
@pytest.mark.parametrize("chunk_blocks", [1, 4, 100])
def test_chunked_loss_and_gradient_equal_the_plain_loss(impl, chunk_blocks):
    hidden, weight, labels, weights = make_inputs()
    expected = plain_loss(hidden, weight, labels, weights)
    (g_expected,) = torch.autograd.grad(expected, hidden)
    out = dflash_loss(hidden, weight, labels, weights, BS, chunk_blocks, impl=impl)
    (g_got,) = torch.autograd.grad(out.loss, hidden)
    assert abs(out.loss.item() - expected.item()) < 1e-5
    torch.testing.assert_close(g_got, g_expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("impl", "max_per_chunk"), [("fused", 1), ("checkpoint", 2)])
def test_lm_head_runs_once_per_chunk(impl, max_per_chunk):
    hidden, weight, labels, weights = make_inputs(B=2, N=6)
    chunk_blocks = 4  # 12 blocks -> 3 chunks
    with CountHeadMatmuls() as fwd:
        out = dflash_loss(hidden, weight, labels, weights, BS, chunk_blocks, impl=impl)
    assert fwd.count == 3  # forward: exactly one lm_head per chunk
    with CountHeadMatmuls() as total:
        out = dflash_loss(hidden, weight, labels, weights, BS, chunk_blocks, impl=impl)
        out.loss.backward()
    assert total.count <= max_per_chunk * 3
    assert total.count == max_per_chunk * 3


def test_metrics_accuracy_streak_and_topk():
    # Hand-built logits: the head is the identity, hidden rows are one-hot scores.
    vocab = 6
    weight = torch.eye(vocab)
    labels = torch.tensor([[0, 1, 2, 3, 0, 4, 5, 1]])  # two blocks of 4
    weights = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 1]], dtype=torch.float32)

    def row(best, second=None):
        r = torch.zeros(vocab)
        r[best] = 5.0
        if second is not None:
            r[second] = 4.0
        return r

    hidden = torch.stack(
        [
            row(0),
            row(1),
            row(2),
            row(5, 3),  # block 1: k=1,2 right, k=3 wrong (label 2nd)
            row(0),
            row(3, 5),
            row(5),
            row(1),  # block 2: k=1 wrong (label 3rd), k=2,3 right
        ]
    )[None]
    out = dflash_loss(hidden, weight, labels, weights, block_size=4, chunk_blocks=1, topk=2)
    m = out.metrics()
    assert m["acc"] == pytest.approx(4 / 6)
    assert m["topk"] == pytest.approx(5 / 6)
    # Streaks: block 1 accepts 2 then +1 = 3; block 2 accepts 0, +1 = 1. Mean 2.
    assert m["streak"] == pytest.approx(2.0)
    assert math.isfinite(m["loss"])


def test_no_grad_path_and_zero_weights_are_finite():
    hidden, weight, labels, weights = make_inputs()
    with torch.no_grad():
        out = dflash_loss(hidden, weight, labels, torch.zeros_like(weights), BS, 4)
    assert out.loss.item() == 0.0
    assert out.metrics()["acc"] == 0.0


def test_anchor_rows_never_reach_lm_head():
    """A block's position 0 (its anchor, weight 0) is not projected: the head's matmuls
    cover N * (bs - 1) rows, and the loss and gradient still equal the plain loss over all."""
    hidden, weight, labels, weights = make_inputs(B=2, N=6)
    rows: list[int] = []

    class HeadRows(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.mm and out.shape[-1] == V:
                rows.append(out.shape[0])
            return out

    with HeadRows():
        out = dflash_loss(hidden, weight, labels, weights, BS, chunk_blocks=100)
    assert rows == [2 * 6 * (BS - 1)]
    expected = plain_loss(hidden, weight, labels, weights)
    assert abs(out.loss.item() - expected.item()) < 1e-6
    (g,) = torch.autograd.grad(out.loss, hidden)
    assert torch.all(g.view(2, 6, BS, H)[:, :, 0] == 0)
