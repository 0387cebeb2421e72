"""`Heartbeat.graphs` (trainer/contract/graphs.py), optional under schema 2: heartbeats written
before it read as {} (nothing captured), a heartbeat that carries it round-trips, and a reader
from before it (its Heartbeat without the field) still reads the rest of the new heartbeat."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from trainer.contract.graphs import MAX_FAILURES, GraphFailure, GraphInfo
from trainer.contract.heartbeat import Heartbeat, parse_heartbeat, read_heartbeat
from trainer.contract.typed import decode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRAINING = FIXTURES / "heartbeats" / "training-cpu.json"  # schema 2, before graphs
SCHEMA_1 = FIXTURES / "rundirs" / "main-c119aa7" / "20261201-031405-tiny-cpu-6e92"


def with_graphs() -> dict[str, typing.Any]:
    data = json.loads(TRAINING.read_text())
    info = GraphInfo(enabled=True, captured=1, replays=440, eager_runs=1)
    info.add_failure(1796094858.5, "RuntimeError: CUDA error: operation not permitted")
    data["graphs"] = {"eval": dataclasses.asdict(info)}
    return data


def test_heartbeats_from_before_read_as_no_graphs():
    for path in (TRAINING, SCHEMA_1 / "heartbeat.json"):
        hb = read_heartbeat(path)
        assert isinstance(hb, Heartbeat) and hb.graphs == {}, path


def test_a_heartbeat_with_graphs_round_trips():
    hb = parse_heartbeat(with_graphs())
    assert isinstance(hb, Heartbeat)
    info = hb.graphs["eval"]
    assert (info.enabled, info.captured, info.replays, info.failed, info.eager_runs) == (
        True, 1, 440, 1, 1,
    )  # fmt: skip
    assert info.failures == [
        GraphFailure(1796094858.5, "RuntimeError: CUDA error: operation not permitted")
    ]
    assert parse_heartbeat(json.loads(json.dumps(hb.to_json()))) == hb
    assert hb.step == 42  # the rest as recorded


def test_a_reader_from_before_graphs_reads_the_new_heartbeat():
    hints = typing.get_type_hints(Heartbeat)
    # The same fields, their defaults (MISSING: required) kept, less `graphs`.
    fields = [
        (f.name, hints[f.name],
         dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(Heartbeat)
        if f.name != "graphs"
    ]  # fmt: skip
    old_heartbeat = dataclasses.make_dataclass("OldHeartbeat", fields)
    new = with_graphs()
    old = decode(old_heartbeat, new)
    assert not hasattr(old, "graphs")
    assert dataclasses.asdict(old) == {k: v for k, v in dataclasses.asdict(
        decode(Heartbeat, new)).items() if k != "graphs"}  # fmt: skip


def test_the_failures_kept_are_bounded_and_the_newest():
    info = GraphInfo(enabled=True)
    for i in range(20):
        info.add_failure(float(i), f"failure {i}")
    assert info.failed == 20 and len(info.failures) == MAX_FAILURES
    assert [f.reason for f in info.failures] == [f"failure {i}" for i in range(12, 20)]
