"""The run dir contract: the step-line grammar, the heartbeat reader, the code hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.contract import (
    HeartbeatError,
    code_hash,
    parse_step_line,
    read_heartbeat,
)
from trainer.steplog import StepRecord

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed-scenarios"


def test_the_operators_line_parses_field_by_field():
    line = (SEED / "step_lines.log").read_text().splitlines()[0]
    f = parse_step_line(line)
    assert f == {
        "elapsed_min": 479,
        "step": 876,
        "loss": 1.3377,
        "acc": 0.120,
        "streak": 1.5,
        "lr": 4.40e-04,
        "noise": 0.0366,
        "tgt_bps": 0.35,
        "dft_bps": 0.35,
        "tok_s": 14200.0,
        "q_pre": [50, 16, 2, 1, 10],
        "q_hs": [60],
        "epoch": 0.17,
        "eta": "11.4d",
    }


def test_what_the_trainer_writes_is_what_the_monitor_reads():
    rec = StepRecord(
        elapsed_s=479 * 60 + 5,
        step=876,
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
    line = rec.line()
    assert line == (SEED / "step_lines.log").read_text().splitlines()[0]
    assert parse_step_line(line)["q_pre"] == [50, 16, 2, 1, 10]


@pytest.mark.parametrize(
    "line",
    ["wandb: Syncing run exp-ddtree-tl-fix", "", "[3m] step=x loss=1", "step=5 loss=1.0"],
)
def test_other_lines_are_not_step_lines(line):
    assert parse_step_line(line) is None


def test_code_hash_tracks_content_and_names_only(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("ignored")
    h = code_hash(tmp_path)
    assert len(h) == 64 and h == code_hash(tmp_path)
    (tmp_path / "notes.txt").write_text("still ignored")
    assert code_hash(tmp_path) == h
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert code_hash(tmp_path) != h


def test_heartbeat_reader(tmp_path):
    path = tmp_path / "heartbeat.json"
    assert read_heartbeat(path) is None
    path.write_text(json.dumps({"schema": 1, "phase": "training", "step": 3}))
    assert read_heartbeat(path)["step"] == 3
    path.write_text(json.dumps({"schema": 99, "phase": "training"}))
    with pytest.raises(HeartbeatError, match="schema 99"):
        read_heartbeat(path)
    path.write_text(json.dumps({"schema": 1, "phase": "dancing"}))
    with pytest.raises(HeartbeatError, match="unknown phase"):
        read_heartbeat(path)
    path.write_text("{")
    with pytest.raises(HeartbeatError, match="not JSON"):
        read_heartbeat(path)
