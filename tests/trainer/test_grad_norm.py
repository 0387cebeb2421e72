"""The gradient norm in metrics.jsonl: every row of a real run on the tiny CPU config
carries the total norm before clipping (the largest of its window's optimizer steps), and
the contract's reader takes it back."""

from __future__ import annotations

import json
import math

import pytest

from trainer.contract.records import MetricsRow, parse_metrics_line


@pytest.mark.parametrize("grad_clip", ["1.0", "0"])  # clipped (its norm kept) or not (measured)
def test_metrics_rows_carry_a_finite_grad_norm(start_trainer, grad_clip):
    p = start_trainer(
        "--max-steps", "6", "--set", "train.log_every=2", "--set", f"train.grad_clip={grad_clip}"
    )  # fmt: skip
    assert p.wait(timeout=240) == 0, p.stdout_path.read_text()[-2000:]
    lines = p.read("metrics.jsonl").splitlines()
    assert len(lines) == 3
    for line in lines:
        row = parse_metrics_line(line)
        assert isinstance(row, MetricsRow)
        assert row.grad_norm is not None and math.isfinite(row.grad_norm) and row.grad_norm > 0
        assert json.loads(line)["grad_norm"] == row.grad_norm
    # Not on the step line: new figures go to the heartbeat and metrics only.
    step_lines = [ln for ln in p.read("train.log").splitlines() if " step=" in ln]
    assert step_lines and not any("grad" in ln for ln in step_lines)


def test_the_clip_folded_into_fused_adamw_steps_as_clip_then_step():
    """`clip_in_step` with a fused AdamW (it runs on the CPU too) hands the clip to the
    optimizer (`grad_scale`) instead of scaling the gradients first: the same norm and, step
    after step, the same weights as `clip_grad_norm_` then the step. The gradients here are
    ~1e4 times the clip, so a clip that did not happen would move the weights far apart."""
    import copy

    import torch

    from trainer.model.optim import clip_in_step

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, fused=True)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, fused=True)
    for _ in range(5):
        x = torch.randn(16, 64) * 10
        for m in (a, b):
            m(x).pow(2).sum().backward()
        want = torch.nn.utils.clip_grad_norm_(list(a.parameters()), 0.5)
        got = clip_in_step(opt_b, list(b.parameters()), 0.5)
        assert got is not None and float(got) == pytest.approx(float(want), rel=1e-6)
        assert float(got) > 1e3  # far above the clip
        opt_a.step()
        opt_b.step()
        opt_a.zero_grad()
        opt_b.zero_grad()
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    # Not fused: clip_grad_norm_ itself, the gradients scaled in place.
    c = copy.deepcopy(net)
    c(torch.randn(16, 64) * 10).pow(2).sum().backward()
    norm = clip_in_step(torch.optim.AdamW(c.parameters()), list(c.parameters()), 0.5)
    assert norm is not None and float(norm) > 0.5
    total = torch.nn.utils.get_total_norm([p.grad for p in c.parameters()])
    assert float(total) == pytest.approx(0.5, rel=1e-4)
