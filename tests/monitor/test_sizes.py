"""Every size from 80x24 up (issue 32): the real app under Pilot at 80x24, 120x40 and
160x48, fed the scripted streams, a recorded heartbeat or a real local agent over the NVML
stand-in, read as the screen's text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from app_scenarios import healthy
from monitor_helpers import typed_event
from test_layout_keys import screen_text, scripted, until

from dflash_tui.state import Store
from dflash_tui.widgets.layout import MIN_HEIGHT, MIN_WIDTH
from trainer.contract.protocol import Follow, HeartbeatEvent

ROOT = Path(__file__).resolve().parents[2]
H200_RUN = (
    ROOT / "tests" / "fixtures" / "rundirs" / "h200-schema2" / "20261201-052645-tiny-gpu-2735"
)


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def run(coro):
    return asyncio.run(coro)


# -- the header -------------------------------------------------------------------------


def test_time_in_training_counts_from_its_first_visit_not_the_last_checkpoint():
    """A real H200 run's heartbeat, written in its second training visit (after a save)."""
    beats = [json.loads(line) for line in (H200_RUN / "telemetry.jsonl").read_text().splitlines()]
    beat = next(
        b
        for b in beats
        if b["phase"] == "training" and "checkpointing" in [v["phase"] for v in b["phase_history"]]
    )
    now = beat["now"]
    s = Store("local", clock=lambda: now)
    s.apply(Follow(run_id=beat["run_id"], t=now))
    s.apply(HeartbeatEvent(run_id=beat["run_id"], data=beat, t=now))
    first = next(v["started_at"] for v in beat["phase_history"] if v["phase"] == "training")
    assert beat["phase_started_at"] > first  # the trainer's own clock restarted at the save
    phase, age = s.shown_phase()
    assert phase == "training" and age == pytest.approx(now - first)
    assert s.phase()[1] == pytest.approx(now - beat["phase_started_at"])  # the visit's own


# -- below the minimum ------------------------------------------------------------------


@pytest.mark.parametrize("size", [(79, 24), (80, 23), (40, 10), (20, 5)])
def test_below_80x24_one_line_says_the_minimum_and_the_dashboard_comes_back(size):
    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            app.redraw(force=True)
            await pilot.pause(0.3)
            lines = [ln for ln in screen_text(app).splitlines() if ln.strip()]
            assert len(lines) == 1, lines
            w, h = size
            assert f"{MIN_WIDTH}x{MIN_HEIGHT}" in lines[0] and f"{w}x{h}" in lines[0], lines
            assert len(lines[0].rstrip()) <= w
            await pilot.resize_terminal(80, 24)
            await until(pilot, lambda: "step=876" in screen_text(app))
            back = screen_text(app)
            assert "step=876" in back and "needs at least" not in back

    run(go())
