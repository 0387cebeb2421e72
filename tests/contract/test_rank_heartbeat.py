"""heartbeat-rank{R}.json at the decoder boundary: the loop times and rates added under
schema 1 read from a real rank's file, an older file without them reads with their
defaults, and an unsound number (NaN, negative, too many stages) makes the file Unreadable,
never a rank that looks fine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.contract.ranks import (
    MAX_STAGES,
    RankHeartbeat,
    parse_rank_heartbeat,
    read_rank_heartbeat,
)
from trainer.contract.typed import Unreadable

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "ranks" / "slow-drafter"


def recorded(rank: int) -> dict:
    return json.loads((RECORDED / f"heartbeat-rank{rank}.json").read_text())


def test_a_recorded_rank_reads_with_its_loop_times() -> None:
    b = read_rank_heartbeat(RECORDED, 3)
    assert isinstance(b, RankHeartbeat), b
    assert b.role == "drafter" and b.loop == "drafter-1"
    assert b.tok_s > 0 and b.batches_s > 0
    assert {"forward", "backward", "wait replicas"} <= set(b.stages_ms)


def test_an_older_rank_file_reads_with_defaults() -> None:
    data = recorded(3)
    for key in ("tok_s", "batches_s", "loop", "stages_ms"):
        del data[key]
    b = parse_rank_heartbeat(data)
    assert isinstance(b, RankHeartbeat), b
    assert (b.tok_s, b.batches_s, b.loop, b.stages_ms) == (0.0, 0.0, "", {})


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"stages_ms": {"forward": float("nan")}}, "'forward': nan ms: not a time"),
        ({"stages_ms": {"forward": -3.0}}, "'forward': -3.0 ms: not a time"),
        ({"stages_ms": {"forward": float("inf")}}, "not a time"),
        ({"stages_ms": {"x" * 65: 1.0}}, "a stage name of 65 characters"),
        ({"stages_ms": {f"s{i}": 1.0 for i in range(MAX_STAGES + 1)}}, "stages (at most"),
        ({"tok_s": float("nan")}, "tok_s nan: not a rate"),
        ({"batches_s": -1.0}, "batches_s -1.0: not a rate"),
        ({"stages_ms": {"forward": "fast"}}, "stages_ms.forward"),
    ],
)
def test_unsound_loop_numbers_make_the_file_unreadable(edit: dict, why: str) -> None:
    data = {**recorded(3), **edit}
    # Through JSON as the file carries it (Python's json writes and reads NaN and Infinity).
    got = parse_rank_heartbeat(json.loads(json.dumps(data)), "heartbeat-rank3.json")
    assert isinstance(got, Unreadable), got
    assert why in got.why, got.why
