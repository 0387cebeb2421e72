"""The one decoder: records from JSON, with the path of the first bad value."""

from __future__ import annotations

import dataclasses

import pytest

from trainer.contract.heartbeat import Heartbeat, Queues
from trainer.contract.typed import MAX_ITEMS, Invalid, decode, encode


@dataclasses.dataclass
class Inner:
    depth: int
    label: str | None = None


@dataclasses.dataclass
class Outer:
    name: str
    items: list[Inner] = dataclasses.field(default_factory=list)
    by_dev: dict[str, Inner] = dataclasses.field(default_factory=dict)
    ratio: float = 0.0
    flag: bool = False


def test_a_record_round_trips():
    data = {
        "name": "x",
        "items": [{"depth": 1, "label": "a"}, {"depth": 2, "label": None}],
        "by_dev": {"cuda:0": {"depth": 3}},
        "ratio": 2,  # an int where a float is expected is a float
        "flag": True,
    }
    rec = decode(Outer, data)
    assert rec.ratio == 2.0 and isinstance(rec.ratio, float)
    assert rec.by_dev["cuda:0"] == Inner(3, None)
    assert decode(Outer, encode(rec)) == rec


def test_unknown_keys_are_ignored_and_missing_ones_take_their_default():
    assert decode(Outer, {"name": "x", "from_the_future": [1, 2]}) == Outer("x")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "name: missing"),
        ({"name": 1}, "name: expected a string, got int"),
        ({"name": "x", "items": [{"depth": "2"}]}, "items[0].depth: expected int, got str"),
        ({"name": "x", "items": [{"depth": True}]}, "items[0].depth: expected int, got bool"),
        ({"name": "x", "by_dev": {"cpu": []}}, "by_dev.cpu: expected an object, got list"),
        ({"name": "x", "items": {"a": 1}}, "items: expected a list, got dict"),
        ({"name": "x", "flag": 1}, "flag: expected true/false, got int"),
        ({"name": "x", "ratio": None}, "ratio: expected a number, got null"),
    ],
)
def test_bad_values_name_their_path(data, message):
    with pytest.raises(Invalid) as e:
        decode(Outer, data)
    assert str(e.value) == message


def test_lenient_mode_drops_bad_optional_fields_only():
    assert decode(Outer, {"name": "x", "ratio": "fast"}, lenient=True) == Outer("x")
    with pytest.raises(Invalid):
        decode(Outer, {"name": 3}, lenient=True)


def test_sizes_are_bounded():
    with pytest.raises(Invalid, match="items"):
        decode(Outer, {"name": "x", "items": [{"depth": 1}] * (MAX_ITEMS + 1)})


def test_the_heartbeats_queues_as_the_old_crash_had_them():
    # `"queues": [1]` crashed three views with an AttributeError before the contract.
    with pytest.raises(Invalid, match="queues: expected an object, got list"):
        decode(Heartbeat, {"schema": 2, "run_id": "r", "pid": 1, "host": "h", "now": 1.0,
                           "phase": "training", "queues": [1]})  # fmt: skip
    assert decode(Queues, {}) == Queues()


def test_threads_decoding_a_record_type_for_the_first_time_all_get_it_whole():
    """Decoders are built once per type, at first use: threads that all use a type for the
    first time together (the agent's loop and its threads) each get every field."""
    import threading

    @dataclasses.dataclass
    class Fresh:  # a type no decode has seen yet
        a: int
        b: list[Inner]
        c: str = "c"

    data = {"a": 1, "b": [{"depth": d} for d in range(50)], "c": "x"}
    start, got, errors = threading.Barrier(8), [], []

    def one() -> None:
        start.wait()
        try:
            got.append(decode(Fresh, data))
        except Exception as e:  # a half-built decoder would show here
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(got) == 8
    assert all(g == Fresh(1, [Inner(d) for d in range(50)], "x") for g in got)
