"""The headless line says what the TUI says (issue 16): queues as depth/capacity, and the
first finding's title whole, never cut mid-word. On the recorded stage-times scenario."""

from __future__ import annotations

from test_diagnosis import NOW, events, store

from dflash_tui.diagnosis import Finding
from dflash_tui.headless import WIDTH, busiest_stage, queues_text, status_line, status_text
from dflash_tui.link.events import LinkStatus
from trainer.contract.heartbeat import QueueDepth


def recorded():
    s = store(events("recorded/stage_times.jsonl"))
    s.apply(LinkStatus(t=NOW, state="connected", detail="", target="local"))
    return s


def test_queues_are_depth_over_capacity_each() -> None:
    q = QueueDepth
    assert queues_text([q(3, 8), q(2, 8)], [q(4, 8)]) == "q_pre 3/8 2/8 q_hs 4/8"
    assert queues_text([], [q(0, 4)]) == "q_pre - q_hs 0/4"
    s = recorded()
    hb = s.heartbeat
    assert hb is not None
    want = queues_text(hb.queues.q_pre, hb.queues.q_hs)
    assert f" | {want} | " in status_line(s, [], now=NOW)
    assert all(f"{d.depth}/{d.capacity}" in want for d in hb.queues.q_pre + hb.queues.q_hs)


def test_a_long_title_goes_under_the_line_wrapped_between_words() -> None:
    s = recorded()
    title = (
        "drafter-1 has waited on q_hs for 41 s while target-0 and target-1 compile their "
        "forward again after a shape they had not seen (bucket 256, recompile 3 of 8)"
    )
    text = status_text(s, [Finding("warning", "x", title, "", "")], now=NOW)
    line, *alert = text.split("\n")
    assert " | ! " not in line and len(line) <= WIDTH
    assert alert[0].startswith("  ! ") and all(len(a) <= WIDTH for a in alert)
    assert len(alert) == 2  # 157 characters: two lines of at most 120
    assert " ".join(a.strip() for a in alert).removeprefix("! ") == title  # every word whole


def test_a_narrow_line_drops_whole_fields_never_half_of_one() -> None:
    s = recorded()
    full = status_line(s, [], now=NOW, width=1000).split(" | ")
    stage = busiest_stage(s)  # in the room left: whichever of its forms fits
    assert len(full) >= 6 and any(f.startswith("hb ") for f in full)
    for width in range(len(full[0]), 140):
        line = status_line(s, [], now=NOW, width=width)
        assert len(line) <= width
        parts = line.split(" | ")
        assert all(p in full or p in stage for p in parts), (width, line)  # whole fields
        fields = [p for p in parts if p not in stage]
        assert fields == [f for f in full if f in fields]  # in their order
        assert parts[0] == full[0]
    # At 60 columns the step, tok/s and heartbeat age stay; the queues and GPUs go first.
    narrow = status_line(s, [], now=NOW, width=60).split(" | ")
    assert [p.split(" ")[0] for p in narrow[1:4]] == ["step", "3.3K", "hb"]
    assert not any(p.startswith("q_pre") for p in narrow)
