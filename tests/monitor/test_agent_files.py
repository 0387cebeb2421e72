"""The agent's file following: offsets, partial lines, truncation, rotation, a huge log."""

from __future__ import annotations

import json
import os
import time

from dflash_tui.agent.files import FileFollower, HeartbeatWatch


def test_lines_come_whole_with_their_offsets(tmp_path):
    p = tmp_path / "train.log"
    f = FileFollower(str(p), offset=0)
    assert f.poll() == ([], None)  # not there yet: no error
    p.write_bytes(b"one\ntw")
    lines, _ = f.poll()
    assert lines == [(0, 4, "one")]
    with open(p, "ab") as fh:
        fh.write(b"o\nthree\n")
    lines, _ = f.poll()
    assert lines == [(4, 8, "two"), (8, 14, "three")]
    assert f.poll() == ([], None)


def test_resume_from_an_offset_neither_loses_nor_repeats(tmp_path):
    p = tmp_path / "train.log"
    p.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    first = FileFollower(str(p), offset=0)
    got, _ = first.poll()
    cut = got[41][1]  # a session ends after line 41
    again = FileFollower(str(p), offset=cut)
    rest, _ = again.poll()
    assert [t for _, _, t in got[:42] + rest] == [f"line {i}" for i in range(100)]


def test_truncation_and_rotation_are_noticed(tmp_path):
    p = tmp_path / "train.log"
    p.write_bytes(b"a\nb\nc\n")
    f = FileFollower(str(p), offset=0)
    f.poll()
    with open(p, "r+b") as fh:  # truncated in place, then written again
        fh.truncate(0)
    lines, notice = f.poll()
    assert notice == {"size": 0, "reason": "truncated"} and lines == []
    with open(p, "ab") as fh:
        fh.write(b"d\n")
    assert f.poll()[0] == [(0, 2, "d")]
    os.rename(p, tmp_path / "train.log.1")  # rotated: a new file under the same name
    p.write_bytes(b"e\n")
    lines, notice = f.poll()
    assert notice["reason"] == "replaced" and lines == [(0, 2, "e")]


def test_a_big_log_opens_at_its_tail_at_once(tmp_path):
    p = tmp_path / "train.log"
    line = b"[1m] step=1 loss=1.0000 " + b"x" * 100 + b"\n"
    with open(p, "wb") as fh:
        fh.truncate(1 << 30)  # a sparse 1 GiB file of NULs, then real lines at its end
        fh.seek(1 << 30)
        fh.write(line * 1000)
    t0 = time.perf_counter()
    f = FileFollower(str(p), offset=None, tail_bytes=64 * 1024)
    lines, _ = f.poll()
    assert time.perf_counter() - t0 < 1.0
    assert lines and all(t == line[:-1].decode() for _, _, t in lines)
    assert lines[-1][1] == p.stat().st_size


def test_a_torn_heartbeat_is_reported_and_the_last_good_kept(tmp_path):
    p = tmp_path / "heartbeat.json"
    w = HeartbeatWatch(str(p))
    assert w.poll() is None
    good = {"schema": 2, "run_id": "r", "pid": 1, "host": "h", "now": 1.0, "phase": "training"}
    p.write_text(json.dumps(good))
    assert w.poll() == ("ok", good)  # the heartbeat as written
    assert w.poll() is None  # unchanged
    p.write_text('{"phase": "train')  # a writer that does not replace atomically
    kind, message = w.poll()
    assert kind == "error" and message.startswith("heartbeat.json unreadable: not JSON")
    p.write_text(json.dumps({**good, "step": "three"}))  # JSON, but not a heartbeat
    assert w.poll() == ("error", "heartbeat.json unreadable: step: expected int, got str")
    assert w.last_good == good


def test_a_huge_line_is_cut_and_marked_and_costs_bounded_memory(tmp_path):
    """A 20 MB line (no newline for a while, then one) comes out as its first 64 KiB and a
    marker; the follower never holds more than that of it; offsets stay exact."""
    from dflash_tui.agent.files import FileFollower

    path = tmp_path / "train.log"
    path.write_bytes(b"first\n")
    f = FileFollower(str(path), offset=0)
    assert [t for _, _, t in f.poll()[0]] == ["first"]
    with open(path, "ab") as out:
        for _ in range(20):  # written in pieces, polled in between: no newline yet
            out.write(b"z" * (1 << 20))
            out.flush()
            assert f.poll()[0] == [] and len(f.partial) <= 65536
        out.write(b"\nnext\n")
    lines = f.poll()[0]
    while not any(t == "next" for _, _, t in lines):
        lines += f.poll()[0]
    (start, end, text), (n_start, _, n_text) = lines[-2], lines[-1]
    assert text == "z" * 65536 + " … [line of 20,971,520 bytes cut at 65,536]"
    assert (start, end) == (6, 6 + (20 << 20) + 1) and n_start == end and n_text == "next"
