"""History lives in the store (every heartbeat and telemetry.jsonl line), and facts about
earlier runs are computed once (dflash_tui/facts.py): rules and panes cannot disagree, and a
finding does not depend on how often a view calls diagnose()."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import random
from typing import Any

from monitor_helpers import typed_event
from rich.console import Console
from test_diagnosis import NOW, Clock, Events, edit_metrics, events, hb, of_type, only, run

from dflash_tui import state
from dflash_tui.app import DFlashApp
from dflash_tui.diagnosis import diagnose
from dflash_tui.facts import expected_memory
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.gpus import GpuPane, expected_bytes

GIB = 1 << 30
MIB = 1 << 20


def beats(n: int, **changes: Any) -> tuple[Events, list[dict[str, Any]]]:
    """healthy_gpu's events, and `n` later heartbeats 2 s apart, each with `changes(k)`."""
    evs = events("healthy_gpu.jsonl")
    last = of_type(evs, "heartbeat")[-1]
    more = []
    for k in range(1, n + 1):
        e = copy.deepcopy(last)
        t = NOW + 2 * k
        e["t"] = e["data"]["now"] = t
        e["data"]["last_step_at"] = t - 0.5
        for key, change in changes.items():
            e["data"][key] = {**e["data"][key], **change(k)}
        more.append(e)
    return evs, more


def live(n: int, every: bool, **changes: Any) -> list[list[Any]]:
    """Findings after each of `n` new heartbeats (`every`), or only after the last."""
    evs, more = beats(n, **changes)
    clock = Clock(NOW)
    s = Store("gpu-box", clock=clock)
    for e in evs:
        s.apply(typed_event(e))
    found = []
    for e in more:
        clock.t = e["t"]
        s.apply(typed_event(e))
        s.apply(
            typed_event({"type": "liveness", "t": clock.t, "run_id": e["run_id"], "alive": True})
        )
        if every:
            found.append(diagnose(s, clock.t))
    return found if every else [diagnose(s, clock.t)]


def test_gil_and_recompiles_do_not_depend_on_how_often_diagnose_runs() -> None:
    changes = {
        "gil": lambda k: {"p50_ms": 6.0, "p99_ms": 25.0, "samples": 300},
        "compile": lambda k: {"recompiles": k, "graphs": 12 + k},
    }
    every = live(5, every=True, **changes)
    once = live(5, every=False, **changes)
    assert every[-1] == once[-1]
    assert only(once[-1], "gil_pressure").evidence.startswith(
        "p99 25 ms (p50 6.0 ms) in the last 3"
    )
    # the first heartbeat (0 recompiles) 10.5 s before the last is in the history either way
    assert only(once[-1], "recompiles").evidence == (
        "5 graphs compiled after warm-up (17 in all), +5 in the last 10s"
    )


def test_allocator_retries_do_not_depend_on_how_often_diagnose_runs() -> None:
    def memory(k: int) -> dict[str, Any]:
        mem = copy.deepcopy(hb(events("healthy_gpu.jsonl"))["memory"])
        mem["cuda:6"]["alloc_retries"] = 3 + k
        return mem

    every = live(3, every=True, memory=memory)
    once = live(3, every=False, memory=memory)
    assert every[-1] == once[-1]
    # since the logged steps (metrics.jsonl: 0 retries a minute before)
    assert "cuda:6: 6 retries, +6 in the last 1m07s" in only(once[-1], "alloc_retries").evidence


def test_telemetry_lines_fill_the_history_in_order_once_each() -> None:
    """telemetry.jsonl (rewritten when thinned: read again from the start) and the live
    heartbeats give one history: sorted by `now`, each heartbeat once."""
    evs, more = beats(6, gil=lambda k: {"p50_ms": 6.0, "p99_ms": 25.0, "samples": 300})
    s = Store("gpu-box", clock=Clock(NOW + 12))
    for e in evs:
        s.apply(typed_event(e))
    telemetry = [json.dumps(e["data"]) for e in more]
    lines = telemetry + telemetry[:3]  # a rewrite: the file again from the start
    random.Random(1).shuffle(lines)
    for text in lines:
        line = {"type": "line", "t": NOW, "run_id": more[0]["run_id"], "file": "telemetry.jsonl"}
        s.apply(typed_event({**line, "offset": 0, "end": 0, "text": text}))
    nows = [b.now for b in s.heartbeats]
    assert nows == sorted(set(nows)) and len(nows) == 7  # the live one and six from the file
    assert s.heartbeat is not None and s.heartbeat.now == NOW - 0.5  # still the live one
    # from the file alone, a finished run's history says what the live monitor would have
    s.apply(typed_event({**more[-1], "t": NOW + 12}))
    assert "gil_pressure" in [f.code for f in diagnose(s, NOW + 12)]


def test_the_history_is_bounded_by_a_window_and_a_count(monkeypatch: Any) -> None:
    monkeypatch.setattr(state, "HISTORY_MAX", 5)
    evs, more = beats(8)
    s = Store("gpu-box", clock=Clock(NOW))
    for e in evs + more:
        s.apply(typed_event(e))
    assert [b.now for b in s.heartbeats] == [e["data"]["now"] for e in more[-5:]]
    monkeypatch.setattr(state, "HISTORY_WINDOW_S", 5.0)
    s.apply(typed_event({**more[-1], "data": {**more[-1]["data"], "now": NOW + 20}}))
    assert [b.now for b in s.heartbeats] == [NOW + 16, NOW + 20]


# -- one number for what a role should hold -----------------------------------------------
def drafter_peaks(*gib: float) -> Any:
    """Earlier comparable runs that trained: the drafter peaked at these (max != median)."""

    def edit(evs: Events) -> None:
        runs = [
            r
            for r in of_type(evs, "runs")[-1]["runs"]
            if r["run_id"].endswith(("-0001", "-0002", "-0005"))
        ]
        for r, peak in zip(runs, gib, strict=True):
            r["role_memory"]["drafter"] = peak * GIB

    return edit


def gpu6(mib: int) -> Any:
    def edit(evs: Events) -> None:
        for g in of_type(evs, "gpu"):
            g["devices"][6]["mem_used"] = mib * MIB

    return edit


def test_the_gpu_pane_and_memory_short_use_the_same_number() -> None:
    peaks = drafter_peaks(70, 79, 95)  # median 79 GiB, max 95 GiB
    f = only(run("healthy_gpu.jsonl", peaks, gpu6(72_700)), "memory_short")
    assert "a drafter peaked at 79.0 GB" in f.evidence
    assert run("healthy_gpu.jsonl", peaks, gpu6(72_900)) == []  # 90% of 79 GiB is the bar

    evs = events("healthy_gpu.jsonl")
    peaks(evs)
    gpu6(72_700)(evs)

    async def go() -> str:
        target = Target(name="gpu-box", kind="ssh", host="gpu-box")
        app = DFlashApp(target, theme_name="dark", connect=False, clock=lambda: NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            for e in evs:
                app.feed(typed_event(e))
            assert (
                expected_bytes(app.store, "drafter") == expected_memory(app.store)["drafter"].usual
            )
            assert expected_memory(app.store)["drafter"].usual == 79 * GIB
            # the pane repaints on its own timer: on a loaded CI host 0.4 s was not always enough
            text = ""
            for _ in range(100):
                await pilot.pause(0.1)
                console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
                console.print(app.query_one(GpuPane).content)
                text = console.export_text()
                if any(ln.startswith("6 ") for ln in text.splitlines()):
                    break
            return text

    pane = asyncio.run(go())
    row = next(ln for ln in pane.splitlines() if ln.startswith("6 "))
    assert "71.0/140G  90% exp" in row  # 72,700 MiB of 79 GiB (of the max, 95 GiB: 75%)


def test_expected_memory_leaves_out_other_configs_and_runs_that_never_trained() -> None:
    evs = events("healthy_gpu.jsonl")
    edit_metrics(evs, lambda m: None)
    s = Store("gpu-box", clock=Clock(NOW))
    for e in evs:
        s.apply(typed_event(e))
    expect = expected_memory(s)
    # qwen3-8b (20/30 GiB, another signature) and the run that crashed compiling (60 GiB) out
    assert expect["target"].runs == [
        "20260519-194100-qwen36-27b-0001",
        "20260519-233000-qwen36-27b-0002",
        "20260520-081200-qwen36-27b-0005",
    ]
    assert expect["target"].usual == 80 * GIB
