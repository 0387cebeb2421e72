"""CUDA-only checks (skipped without a GPU; run them on the lent H200)."""

from __future__ import annotations

import pytest
import torch

from trainer.attention import attend, make_block_mask, make_dense_mask

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_and_sdpa_agree_forward_and_backward(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    B, N, bs, ctx, Hq, Hkv, D = 2, 24, 16, 640, 8, 2, 64
    anchors = torch.randint(1, ctx - 1, (B, N), generator=g, device="cuda").sort(dim=1).values
    anchors[0, :3] = torch.tensor([1, 200, 201], device="cuda")
    keep = torch.ones(B, N, dtype=torch.bool, device="cuda")
    keep[1, -5:] = False
    anchors[1, -5:] = 0

    def inputs():
        q = torch.randn(B, Hq, N * bs, D, generator=g, device="cuda", dtype=dtype)
        k = torch.randn(B, Hkv, ctx + N * bs, D, generator=g, device="cuda", dtype=dtype)
        v = torch.randn(B, Hkv, ctx + N * bs, D, generator=g, device="cuda", dtype=dtype)
        return q, k, v

    q, k, v = inputs()
    grad = torch.randn(B, Hq, N * bs, D, generator=g, device="cuda", dtype=dtype)
    outs = {}
    for name, mask in (
        ("sdpa", make_dense_mask(anchors, keep, ctx, bs)),
        ("flex", make_block_mask(anchors, keep, ctx, bs)),
    ):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, mask)
        out.backward(grad)
        outs[name] = (out, qq.grad, kk.grad, vv.grad)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    for a, b in zip(outs["flex"], outs["sdpa"], strict=True):
        assert not a.isnan().any()
        torch.testing.assert_close(a.float(), b.float(), **tol)
