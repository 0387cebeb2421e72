"""telemetry.jsonl: thinned as it ages, bounded for a long run, phase changes always kept."""

from __future__ import annotations

import json

from trainer.contract.telemetry import COMPACT_EVERY, Entry, TelemetryWriter, read_telemetry, thin

HOUR = 3600.0


def entries(start: float, end: float, every: float, phase: str = "training") -> list[Entry]:
    out, t = [], start
    while t < end:
        out.append(Entry(t, phase, json.dumps({"now": t})))
        t += every
    return out


def test_thinning_keeps_recent_entries_whole_and_older_ones_sparse():
    now = 10 * 24 * HOUR  # a ten-day run, one entry every 5 s
    kept = thin(entries(0.0, now, 5.0), now)
    recent = [e for e in kept if now - e.now <= 600]
    hours = [e for e in kept if 600 < now - e.now <= 6 * HOUR]
    older = [e for e in kept if now - e.now > 6 * HOUR]
    assert len(recent) == 120  # every entry of the last 10 minutes
    assert 340 <= len(hours) <= 361  # one a minute for 6 hours
    assert len(older) <= (10 * 24 - 6) * 6 + 1  # one per 10 minutes before that
    assert len(kept) < 2000  # of 172,800 written


def test_phase_changes_survive_thinning():
    now = 24 * HOUR
    evs = entries(0.0, 100.0, 5.0, "compiling") + entries(100.0, now, 5.0, "training")
    kept = thin(evs, now)
    assert [e.phase for e in kept[:1]] == ["compiling"]
    assert any(e.now == 100.0 and e.phase == "training" for e in kept)


def test_the_writer_rewrites_the_file_bounded(tmp_path):
    path = tmp_path / "telemetry.jsonl"
    w = TelemetryWriter(path, interval_s=5.0)
    t0 = 1_000_000.0
    for i in range(COMPACT_EVERY * 10):
        beat = {"schema": 2, "run_id": "r", "pid": 1, "host": "h", "phase": "training",
                "now": t0 + 5.0 * i}  # fmt: skip
        w.append(beat)
        w.append({**beat, "now": beat["now"] + 1.0})  # inside the interval: not appended
    beats, skipped = read_telemetry(path)
    assert skipped == 0
    assert len(beats) < COMPACT_EVERY * 2  # thinned, not 2400 lines
    assert beats[-1].now == t0 + 5.0 * (COMPACT_EVERY * 10 - 1)
    path.write_text(path.read_text() + "{torn\n")
    assert read_telemetry(path)[1] == 1
