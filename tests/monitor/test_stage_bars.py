"""The TUI under Pilot on heartbeats from real CPU runs (tests/fixtures/heartbeats): a stage
bar per pipeline thread, fitted to the terminal, and the compiling phase's progress."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import typed_event
from rich.text import Text

from dflash_tui.app import DFlashApp
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.stages import StagePane

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HEARTBEATS = FIXTURES / "heartbeats"
OLD = FIXTURES / "rundirs" / "h200-schema2" / "20261201-052645-tiny-gpu-2735" / "heartbeat.json"
TARGET = Target(name="local", kind="local")
PIPELINE = ["prefetch-0", "prefetch-1", "target-0", "target-1", "drafter-0", "drafter-1"]


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HEARTBEATS / name).read_text())
    return data


def events(hb: dict[str, Any]) -> list[Any]:
    """What the link hands the app about a run whose heartbeat is `hb`."""
    t = hb["now"]
    return [
        # connected: a pane never connected is behind its "not connected" note
        typed_event({"type": "link", "t": t, "state": "connected"}),
        typed_event({"type": "follow", "t": t, "run_id": hb["run_id"], "run_dir": "/runs/x"}),
        typed_event({"type": "heartbeat", "t": t, "run_id": hb["run_id"], "data": hb}),
    ]


def pane_lines(pane: StagePane) -> list[str]:
    content = pane.content
    assert isinstance(content, Text)  # host strings reach a widget only as Text
    return content.plain.split("\n")


async def shown(size: tuple[int, int], *beats: dict[str, Any]) -> dict[str, Any]:
    """Feed the heartbeats one after another; what the panes show after each."""
    clock = {"t": beats[0]["now"]}
    app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: clock["t"])
    seen: dict[str, Any] = {"stages": [], "heartbeat": [], "width": 0, "content": []}
    async with app.run_test(size=size) as pilot:
        for hb in beats:
            clock["t"] = hb["now"]
            for e in events(hb):
                app.feed(e)
            app.redraw(force=True)
            await pilot.pause(0.3)
            pane = app.query_one(StagePane)
            seen["stages"].append(pane_lines(pane))
            seen["content"].append(pane.content)
            seen["width"] = pane.size.width
            heart = app.query_one(HeartbeatPane)
            strips = heart.render_lines(heart.region.reset_offset)
            text = " ".join("".join(seg.text for seg in strip).strip() for strip in strips)
            seen["heartbeat"].append(re.sub(r"\s+", " ", text))
    return seen


def run(size: tuple[int, int], *beats: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(shown(size, *beats))


# -- stage bars ------------------------------------------------------------------------------
def test_a_bar_per_pipeline_thread_in_loop_order() -> None:
    """training-cpu.json: target-0 {forward 365.9, mask 12.5, transfer 0.06, wait q_hs 100.6,
    wait q_pre 0.03} (JSON's order) is a 479 ms loop, forward 76 %, in the loop's order."""
    (lines,) = run((160, 60), recorded("training-cpu.json"))["stages"]
    names = [ln.split()[0] for ln in lines[:-1]]
    assert names == PIPELINE  # no MainThread, heartbeat or probe: they have no loop
    target = lines[2]
    assert re.search(r"target-0\s+cpu [█░]{16}\s+479 ms  forward 76% · wait q_hs 21% · mask 3%$",
                     target), target  # fmt: skip
    assert lines[0].endswith("496 ms  wait q_pre 99% · build batch 1%")
    assert "backward 49% · forward 49% · optimizer 2%" in lines[4]
    # The legend: waits first, then the work stages in the loops' order.
    assert lines[-1].startswith("░ wait  █ build batch  █ forward  █ transfer  █ mask")


def test_the_bar_is_the_loop_split_by_stage() -> None:
    (content,) = run((160, 60), recorded("training-cpu.json"))["content"]
    target = content.split("\n")[2]
    styles = {}
    for span in target.spans:
        piece = target.plain[span.start : span.end]
        if set(piece) <= {"█", "░"}:
            styles[str(span.style)] = styles.get(str(span.style), 0) + len(piece)
    # 16 cells: forward 76.4 % (12.2), wait q_hs 21.0 % (3.4), mask 2.6 % (0.4); the
    # cell left over goes to the largest remainder, the mask's.
    assert styles == {"cyan": 12, "yellow": 1, "dim": 3}, styles
    drafter = content.split("\n")[4]
    bold = [drafter.plain[s.start : s.end] for s in drafter.spans if "bold" in str(s.style)]
    assert bold == ["drafter-0 "]  # the busiest thread: it works 99.8 % of its step


@pytest.mark.parametrize(
    ("columns", "device", "stages_listed"),
    # Below 100 columns the side column moves above the log (widgets/layout.py), so the
    # stage pane is widest-but-one at 80 and narrowest at 100.
    [(200, True, 3), (120, True, 2), (100, False, 1), (80, True, 2)],
)
def test_it_fits_the_terminal(columns: int, device: bool, stages_listed: int) -> None:
    seen = run((columns, 70), recorded("training-cpu.json"))  # rows for a bar per thread
    (lines,) = seen["stages"]
    assert all(len(ln) <= seen["width"] for ln in lines), (seen["width"], lines)
    rows = lines[: len(PIPELINE)]
    assert [r.split()[0] for r in rows] == PIPELINE
    assert all(re.search(r"\d ms", r) for r in rows)  # the period, whatever the width
    assert (" cpu " in rows[2]) == device
    assert rows[2].count("%") == stages_listed, rows[2]


def test_a_short_pane_shows_a_row_per_role() -> None:
    """120x44 (the plots shown, widgets/layout.py) leaves the stage box (half the column) 4
    lines: the roles' means and the legend."""
    (lines,) = run((120, 44), recorded("training-cpu.json"))["stages"]
    assert [ln.split("  ")[0].split(" cpu")[0] for ln in lines[:3]] == [
        "prefetch ×2",
        "target ×2",
        "drafter ×2",
    ]
    assert lines[3].startswith("░ wait  █ build batch"), lines
    assert "474 ms  forward 77% · wait q_hs 21%" in lines[1]


def test_a_pane_too_short_for_the_roles_shows_the_busiest_thread() -> None:
    """80x52 (the queues and alerts above the log, the plots shown) leaves the stage box
    room for one row and the legend: the thread the others wait for."""
    (lines,) = run((80, 52), recorded("training-cpu.json"))["stages"]
    assert len(lines) == 2 and re.match(r"drafter-0 cpu █+  452 ms  backward 49%", lines[0])
    assert lines[1].startswith("░ wait"), lines


def test_without_stage_times_it_says_why_and_updates_with_each_heartbeat() -> None:
    """The same run compiling (no loop yet), then training; and a trainer from before stage
    timing (the H200 fixture, step 366)."""
    seen = run((160, 60), recorded("compiling-cpu.json"), recorded("training-cpu.json"))
    assert seen["stages"][0] == ["stage times from the first step"]
    assert [ln.split()[0] for ln in seen["stages"][1][:-1]] == PIPELINE
    old = json.loads(OLD.read_text())
    assert run((160, 60), old)["stages"] == [["no stage times in this trainer's heartbeat"]]


def test_a_thread_in_one_state_for_long_says_so_instead_of_old_medians() -> None:
    """Medians change when a loop ends: drafter-1 blocked for 40 s has not ended one."""
    hb = recorded("training-cpu.json")
    d1 = next(t for t in hb["threads"] if t["name"] == "drafter-1")
    d1["state"], d1["since"] = "waiting: q_hs empty", hb["now"] - 40
    (lines,) = run((160, 60), hb)["stages"]
    assert lines[5].endswith("474 ms  'waiting: q_hs empty' for 40s now"), lines[5]
    assert "for 40s" not in lines[4]


def test_stage_times_that_are_no_times_are_left_out() -> None:
    """The heartbeat comes from the host: NaN, negative and overflowing figures draw nothing
    odd, and the rules still run (a rule that raises says `rule_error`)."""
    from dflash_tui.diagnosis import diagnose

    hb = recorded("training-cpu.json")
    for t in hb["threads"]:
        if t["name"] == "target-0":
            t["stages_ms"] = {"forward": float("nan"), "mask": -3.0, "wait q_hs": 12.0}
        if t["name"] == "target-1":
            t["stages_ms"] = {"forward": 1e308, "mask": 1e308}  # adds up to inf: no row
    seen = run((160, 60), hb)
    (lines,) = seen["stages"]
    names = [ln.split()[0] for ln in lines[:-1]]
    assert names == [n for n in PIPELINE if n != "target-1"]
    assert lines[2].startswith("target-0") and lines[2].endswith("12 ms  wait q_hs 100%")
    s = Store("local", clock=lambda: hb["now"])
    for e in events(hb):
        s.apply(e)
    assert "rule_error" not in [f.code for f in diagnose(s, hb["now"])]


# -- compile progress --------------------------------------------------------------------------
def test_the_phase_line_says_the_graphs_while_compiling() -> None:
    """compiling-gpu.json: a real compiling heartbeat with a GPU warm-up's progress edited in
    (tests/fixtures/heartbeats/README.md)."""
    (line,) = run((160, 60), recorded("compiling-gpu.json"))["heartbeat"]
    assert (
        "phase compiling for 10s (graphs 3/6: graph 4: forward of 2/0, bucket 4096 on cuda:0, "
        "12s; last time 30.6s with an empty cache)"
    ) in line, line


def test_the_phase_line_on_a_first_compile_and_on_the_cpu() -> None:
    first = recorded("compiling-gpu.json")
    first["compile"].update(expected=None, last_s=None, last_cache=None)
    first["phase_progress"]["total"] = None
    (line,) = run((160, 60), first)["heartbeat"]
    assert (
        "compiling for 10s (graphs 3 so far (first compile with this cache): graph 4: forward "
        "of 2/0, bucket 4096 on cuda:0, 12s)"
    ) in line, line
    # The CPU path compiles nothing; the cache's history says so, and what the warm-up took.
    (line,) = run((160, 60), recorded("compiling-cpu.json"))["heartbeat"]
    assert "compiling for 10s (no graphs to compile; last time 1.5s with a warm cache)" in line


def test_an_older_trainer_while_compiling_shows_the_phase_alone() -> None:
    old = copy.deepcopy(recorded("compiling-cpu.json"))
    old["phase_progress"] = None  # what a trainer before compile progress wrote
    (line,) = run((160, 60), old)["heartbeat"]
    assert "phase compiling for 10s heartbeat" in line, line


async def _stage_box_shown(size: tuple[int, int]) -> tuple[bool, int]:
    hb = recorded("training-cpu.json")
    app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: hb["now"])
    async with app.run_test(size=size) as pilot:
        for e in events(hb):
            app.feed(e)
        app.redraw(force=True)
        await pilot.pause(0.3)
        return bool(app.query_one("#stages-box").display), app.query_one("#steplog").size.height


def test_on_a_short_terminal_the_stage_bars_give_way_to_the_step_log() -> None:
    """At 80x24 the stage box left the step log no line at all."""
    shown_small, log_small = asyncio.run(_stage_box_shown((80, 24)))
    assert not shown_small and log_small >= 3
    shown_big, log_big = asyncio.run(_stage_box_shown((160, 48)))
    assert shown_big and log_big >= 3
