"""The replay's pure part (dflash_tui/replay.py) on the recorded crashed run: which entry a
time names, what the store knows at an entry (and not yet), and the reader's rules for what
the run dir holds that is not a heartbeat of this run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dflash_tui.diagnosis import diagnose
from dflash_tui.replay import ReplayError, parse_at, recording

ROOT = Path(__file__).resolve().parents[2]
RUN = "20261202-160630-tiny-cpu-56b8"
FOLDER = ROOT / "tests" / "fixtures" / "rundirs" / "replay-crash" / RUN


def texts() -> tuple[str, str, str]:
    telemetry, metrics, log = ("telemetry.jsonl", "metrics.jsonl", "train.log")
    return tuple((FOLDER / n).read_text() for n in (telemetry, metrics, log))  # type: ignore[return-value]


def beats() -> list[dict]:
    return [json.loads(line) for line in (FOLDER / "telemetry.jsonl").read_text().splitlines()]


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


def test_at_names_a_time_before_the_end_or_a_clock_time_on_its_day(utc):
    end = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    assert parse_at("end", end) == end
    assert parse_at("-5m", end) == end - 300
    assert parse_at("-1h30m", end) == end - 5400
    assert parse_at("-90s", end) == parse_at("-90", end) == end - 90
    assert parse_at("07:59:30", end) == end - 30
    assert parse_at("7:00", end) == end - 3600
    assert parse_at("09:00:00", end) == end - 23 * 3600  # after the end: the day before
    for bad in ("yesterday", "-", "25:00", "12:61", "5m", "-5x"):
        with pytest.raises(ReplayError, match="not a time"):
            parse_at(bad, end)


def test_each_moment_knows_what_had_happened_by_then_and_nothing_later():
    rec = recording(RUN, *texts())
    want = beats()
    assert [e.beat.now for e in rec.entries] == [b["now"] for b in want]
    end = len(rec.entries) - 1
    mid = end // 2
    s = rec.store_at(mid)
    assert s.heartbeat is not None and s.heartbeat.step == want[mid]["step"]
    assert s.clock() == want[mid]["now"] and s.heartbeat_age() == 0.0
    assert all(row.time <= want[mid]["now"] for row in s.metrics) and s.metrics
    assert max(line.step for line in s.step_lines) <= want[mid]["step"]
    assert [b.now for b in s.heartbeats] == [b["now"] for b in want[: mid + 1]]
    # Running then: no outcome, no crash finding; the end has both.
    assert s.process_alive() is True and s.outcome() is None
    assert "crashed" not in [f.code for f in diagnose(s)]
    last = rec.store_at(end)
    assert last.heartbeat is not None and last.heartbeat.phase == "crashed"
    assert any(f.severity == "critical" for f in diagnose(last))


def test_a_minute_back_and_on_and_a_time_before_the_first_entry():
    rec = recording(RUN, *texts())
    times = [e.beat.now for e in rec.entries]
    end = len(times) - 1
    back = rec.step_minutes(end, -1)
    assert times[back] <= times[end] - 60 < times[back + 1]
    assert times[rec.step_minutes(back, 1)] >= times[back] + 60
    assert rec.step_minutes(end, 1) == end and rec.step_minutes(0, -1) == 0
    assert rec.index_at(0.0) == 0 and rec.index_at(float("inf")) == end


def test_a_heartbeat_of_another_run_or_a_partial_line_is_skipped_and_counted():
    telemetry, metrics, log = texts()
    lines = telemetry.splitlines()
    partial = lines[0][len(lines[0]) // 2 :]
    other = json.loads(lines[1])
    other["run_id"] = "another-run"
    text = "\n".join([partial, json.dumps(other), *lines[2:]])
    rec = recording(RUN, text, metrics, log, cut=("telemetry.jsonl",))
    assert len(rec.entries) == len(lines) - 2
    assert rec.skipped == 2 and "another-run" in (rec.skipped_last or "")
    assert rec.cut == ["telemetry.jsonl"]


def test_no_telemetry_is_one_line_naming_the_run():
    with pytest.raises(ReplayError, match=f"run {RUN}: no telemetry to replay"):
        recording(RUN, "", "", "")
    with pytest.raises(ReplayError, match="2 lines unreadable"):
        recording(RUN, "garbage\n{}\n", "", "")


def test_a_store_at_an_entry_is_quick_enough_for_a_key_press():
    rec = recording(RUN, *texts())
    t0 = time.perf_counter()
    for i in range(len(rec.entries)):
        rec.store_at(i)
    per_entry_ms = (time.perf_counter() - t0) / len(rec.entries) * 1000
    assert per_entry_ms < 250, per_entry_ms  # generous: two shared cores, tests beside
