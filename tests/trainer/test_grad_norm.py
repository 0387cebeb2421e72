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
