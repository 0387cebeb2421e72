"""metrics.jsonl rows' grad_norm at the boundary: what an older trainer, a poisoned step or
a hostile file writes there is read without an exception. The row is a real one, recorded
(tests/fixtures/scenarios/recorded/healthy_training.jsonl); only grad_norm is edited."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer.contract.records import MetricsRow, parse_metrics_line
from trainer.contract.typed import Unreadable

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "recorded"


def _recorded_row() -> dict:
    for ln in (RECORDED / "healthy_training.jsonl").read_text().splitlines():
        if ln.startswith("{"):
            e = json.loads(ln)
            if e.get("type") == "line" and e.get("file") == "metrics.jsonl":
                return json.loads(e["text"])
    raise AssertionError("no metrics row recorded")


def _with(**changes: object) -> str:
    row = _recorded_row()
    row.update(changes)
    return json.dumps(row)


def test_the_recorded_row_has_its_grad_norm():
    row = parse_metrics_line(json.dumps(_recorded_row()))
    assert isinstance(row, MetricsRow) and row.grad_norm == _recorded_row()["grad_norm"]


def test_an_older_trainers_row_has_none():
    data = _recorded_row()
    del data["grad_norm"]
    row = parse_metrics_line(json.dumps(data))
    assert isinstance(row, MetricsRow) and row.grad_norm is None and row.step == data["step"]


@pytest.mark.parametrize("text", ["NaN", "Infinity"])
def test_a_non_finite_norm_is_kept(text):
    # A NaN step's norm is NaN: real, and the rules skip what is not finite.
    row = parse_metrics_line(_with(grad_norm=0).replace('"grad_norm": 0', f'"grad_norm": {text}'))
    assert isinstance(row, MetricsRow) and row.grad_norm is not None
    assert not math.isfinite(row.grad_norm)


def test_a_negative_norm_is_dropped_not_the_row():
    row = parse_metrics_line(_with(grad_norm=-3.5))
    assert isinstance(row, MetricsRow) and row.grad_norm is None and row.loss > 0


@pytest.mark.parametrize("value", ["big", [1.0], {"x": 1}, True])
def test_a_norm_of_the_wrong_type_makes_the_row_unreadable(value):
    got = parse_metrics_line(_with(grad_norm=value))
    assert isinstance(got, Unreadable) and "grad_norm" in got.why
