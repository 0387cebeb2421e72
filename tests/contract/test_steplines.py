"""The step line: the operators' exact shape, formatter and parser round-trip."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from trainer.contract.records import MetricsRow
from trainer.contract.steplines import StepLine, parse_step_line, step_line

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed-scenarios"
OPERATORS_LINE = (SEED / "step_lines.log").read_text().splitlines()[0]


def test_the_operators_line_parses_field_by_field():
    assert parse_step_line(OPERATORS_LINE) == StepLine(
        elapsed_min=479,
        step=876,
        loss=1.3377,
        acc=0.120,
        streak=1.5,
        lr=4.40e-04,
        noise=0.0366,
        tgt_bps=0.35,
        dft_bps=0.35,
        tok_s=14200.0,
        q_pre=[50, 16, 2, 1, 10],
        q_hs=[60],
        epoch=0.17,
        eta="11.4d",
    )


def test_what_the_trainer_writes_is_what_operators_grep():
    row = MetricsRow(
        step=876,
        elapsed_s=479 * 60 + 5,
        loss=1.33771,
        acc=0.1204,
        streak=1.54,
        lr=4.4e-4,
        noise=0.0366,
        tgt_bps=0.351,
        dft_bps=0.349,
        tok_s=14234.0,
        q_pre=[50, 16, 2, 1, 10],
        q_hs=[60],
        epoch=0.1712,
        eta_s=11.4 * 86400,
    )
    assert row.step_line().format() == OPERATORS_LINE


def test_format_then_parse_is_the_identity_on_printed_lines():
    rng = random.Random(0)
    for _ in range(2000):
        line = step_line(
            elapsed_s=rng.uniform(0, 1e6),
            step=rng.randrange(10**9),
            loss=rng.choice([rng.uniform(0, 20), float("nan"), float("inf")]),
            acc=rng.random(),
            streak=rng.uniform(1, 16),
            lr=rng.uniform(0, 1e-2),
            noise=rng.random() / 10,
            tgt_bps=rng.uniform(0, 50),
            dft_bps=rng.uniform(0, 50),
            tok_s=rng.choice([rng.uniform(0, 999), rng.uniform(1e3, 1e6), rng.uniform(1e6, 1e8)]),
            q_pre=[rng.randrange(64) for _ in range(rng.randrange(1, 9))],
            q_hs=[rng.randrange(64) for _ in range(rng.randrange(1, 9))],
            epoch=rng.uniform(0, 100),
            eta_s=rng.choice([None, rng.uniform(0, 1e7)]),
        ).format()
        parsed = parse_step_line(line)
        assert parsed is not None, line
        assert parsed.format() == line


@pytest.mark.parametrize(
    "line",
    [
        "wandb: Syncing run exp-ddtree-tl-fix",
        "",
        "[3m] step=x loss=1",
        "step=5 loss=1.0",
        # the shape of a step line with a value that is no number: not a step line, no error
        OPERATORS_LINE.replace("loss=1.3377", "loss=.."),
        OPERATORS_LINE.replace("acc=0.120", "acc=1.2.3"),
        OPERATORS_LINE + " " * 5000,
        "[1m] " + "step=1 " * 2000,
    ],
)
def test_other_lines_are_not_step_lines(line):
    assert parse_step_line(line) is None
