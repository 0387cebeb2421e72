"""CUDA graphs where operators look (issue 30): the heartbeat's `graphs`, recorded on the
H200 (tests/fixtures/graphs/README.md), in `status --json`, the `status` lines, the heartbeat
pane's words, and the `graphs_fell_back` finding, which fires only when captures failed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from test_diagnosis import NOW, codes, events, hb, only, run, store

from dflash_tui import cuda_graphs
from dflash_tui.diagnosis import diagnose
from trainer.contract.heartbeat import parse_heartbeat

RECORDED = json.loads(
    (
        Path(__file__).resolve().parents[1] / "fixtures" / "graphs" / "h200-eval-graphs.json"
    ).read_text()
)
# The message torch raises when another thread allocates during a global capture.
REASON = (
    "RuntimeError: CUDA error: operation not permitted when stream is capturing\n"
    "CUDA kernel errors might be asynchronously reported"
)


def fell_back() -> dict[str, Any]:
    """The recording with the README's edits: two failed captures, one eager eval."""
    g = copy.deepcopy(RECORDED)
    g["eval"].update(captured=0, replays=0, failed=2, eager_runs=1)
    g["eval"]["failures"] = [{"at": 1796103000.0, "reason": REASON}] * 2
    return g


def with_graphs(graphs: dict[str, Any]):
    def edit(evs: list[dict[str, Any]]) -> None:
        hb(evs)["graphs"] = graphs

    return edit


def test_graphs_in_use_say_so_and_raise_nothing():
    found = run("healthy_gpu.jsonl", with_graphs(RECORDED))
    assert "graphs_fell_back" not in codes(found)
    evs = events("healthy_gpu.jsonl")
    with_graphs(RECORDED)(evs)
    beat = parse_heartbeat(hb(evs))
    assert cuda_graphs.lines(beat) == ["eval: in use · 1 captured · 189 replays"]


def test_failed_captures_raise_graphs_fell_back_with_the_reason_on_one_line():
    f = only(run("healthy_gpu.jsonl", with_graphs(fell_back())), "graphs_fell_back")
    assert f.severity == "warning"
    assert f.title == "CUDA graphs of the eval fell back to eager"
    assert "2 captures failed, 1 run eagerly, 0 captured" in f.evidence
    assert "operation not permitted when stream is capturing CUDA kernel" in f.evidence
    assert "\n" not in f.evidence and "eval.cuda_graphs" in f.action


def test_graphs_off_on_a_hybrid_are_no_fault():
    off = {"eval": {**RECORDED["eval"], "enabled": False, "captured": 0, "replays": 0}}
    off["eval"]["off_reason"] = "a hybrid target (Gated DeltaNet) decodes one prompt at a time"
    found = run("healthy_gpu.jsonl", with_graphs(off))
    assert "graphs_fell_back" not in codes(found)
    evs = events("healthy_gpu.jsonl")
    with_graphs(off)(evs)
    (line,) = cuda_graphs.lines(parse_heartbeat(hb(evs)))
    assert line.startswith("eval: off (a hybrid target")


def test_status_json_carries_the_graphs():
    evs = events("healthy_gpu.jsonl")
    with_graphs(fell_back())(evs)
    s = store(evs)
    snap = s.to_json()
    assert snap["graphs"]["eval"]["failed"] == 2
    assert snap["graphs"]["eval"]["failures"][0]["reason"] == REASON
    assert "graphs_fell_back" in codes(diagnose(s, NOW))


def test_a_hostile_reason_is_bounded_and_on_one_line():
    g = fell_back()
    g["eval"]["failures"] = [{"at": 1.0, "reason": "x\x1b[31m" + "y" * 10_000}]
    evs = events("healthy_gpu.jsonl")
    with_graphs(g)(evs)
    (line,) = cuda_graphs.lines(parse_heartbeat(hb(evs)))
    assert len(line) < 400 and line.endswith("…")
