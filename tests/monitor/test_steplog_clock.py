"""The step log's wall-clock column (issue 32: "a wall-clock time column you can toggle", as
less and toolong have): C on the dashboard puts each step line's time before it, the time
metrics.jsonl's row of that step recorded, in the operator's time zone; C again takes it away.

A run dir a real trainer wrote (tests/fixtures/rundirs/main-c119aa7, b507: step lines every
10 steps to 50, a metrics row each), read by the real agent, the real app under Pilot.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
from monitor_helpers import typed_event, wait_for
from test_diagnosis import NOW, events

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.steplog import StepLog

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7" / "20261201-031436-tiny-cpu-b507"


@pytest.fixture
def run_root(local_target: Target) -> Target:
    root = Path(local_target.effective_run_root)
    root.mkdir(parents=True)
    shutil.copytree(RUN, root / RUN.name)
    return local_target


def shown_lines(log: StepLog) -> list[str]:
    return ["".join(seg.text for seg in strip).rstrip() for strip in log.lines]


def local_clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def test_c_shows_each_step_lines_time_and_hides_it_again(run_root):
    logged = {
        row["step"]: row["time"]
        for row in map(json.loads, (RUN / "metrics.jsonl").read_text().splitlines())
    }

    async def go():
        app = DFlashApp(run_root, theme_name="dark")
        async with app.run_test(size=(160, 48)) as pilot:
            log = app.query_one(StepLog)
            await wait_for(pilot, lambda: len(app.store.metrics) == 5, "the metrics rows")
            await wait_for(
                pilot, lambda: any("step=50 " in ln for ln in shown_lines(log)), "step 50"
            )
            before = shown_lines(log)
            await pilot.press("C")
            await pilot.pause(0.3)
            with_clock = shown_lines(log)
            assert len(with_clock) == len(before)
            for step, t in logged.items():
                line = next(ln for ln in with_clock if f" step={step} " in ln)
                assert line.startswith(f"{local_clock(t)} 0m step={step} "), line
            other = next(ln for ln in with_clock if "SIGTERM" in ln)
            assert other.startswith(" " * 9) and other.strip() in before  # no time of its own
            assert "[clock]" in str(app.query_one("#log-title").render())

            # the filter reads the line, not the time before it: a time matches nothing
            await pilot.press("slash", *local_clock(logged[30])[:5], "enter")
            await pilot.pause(0.3)
            assert shown_lines(log) == []
            await pilot.press("slash", "ctrl+u", *"step=30 ", "enter")
            await pilot.pause(0.3)
            assert [ln[:8] for ln in shown_lines(log)] == [local_clock(logged[30])]

            await pilot.press("slash", "ctrl+u", "enter", "C")
            await pilot.pause(0.3)
            assert shown_lines(log) == before
            assert "[clock]" not in str(app.query_one("#log-title").render())

    asyncio.run(go())


def test_the_newest_step_line_before_its_metrics_row_takes_the_time_it_came():
    """train.log and metrics.jsonl are followed apart: a step line may come before its row.
    The recorded held_out_eval run, its last metrics row held back."""
    evs = events("recorded/held_out_eval.jsonl")
    run_id = next(e["run_id"] for e in reversed(evs) if e.get("type") == "follow")
    ours = [e for e in evs if e.get("type") == "line" and e["run_id"] == run_id]
    last_row = [e for e in ours if e["file"] == "metrics.jsonl"][-1]
    step = json.loads(last_row["text"])["step"]
    line = next(e for e in ours if e["file"] == "train.log" and f"] step={step} " in e["text"])

    async def go():
        app = DFlashApp(Target(name="cpu-box", kind="local"), connect=False, clock=lambda: NOW)
        for e in evs:
            if e is not last_row:
                app.feed(typed_event(e))
        async with app.run_test(size=(160, 48)) as pilot:
            log = app.query_one(StepLog)
            await pilot.press("C")
            await pilot.pause(0.3)
            shown = next(ln for ln in shown_lines(log) if f" step={step} " in ln)
            assert shown.startswith(local_clock(line["t"])), shown
            earlier = next(ln for ln in shown_lines(log) if " step=10 " in ln)
            assert not earlier.startswith(" ")  # its row came: the row's time

    asyncio.run(go())
