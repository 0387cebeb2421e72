"""The queue pane under Pilot shows the queues the run has (issue 33 A1): a run under
runtime.routing = "shared" has one q_pre and one q_hs, fed to every target and drafter; a
fixed one has one of each per target and per drafter. Both from runs recorded on the real
trainer (tests/infra/record_scenarios.py: shared_routing, thread_straggler)."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from monitor_helpers import typed_event
from rich.console import Console
from test_diagnosis import NOW, events

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.queues import QueuePane

TARGET = Target(name="cpu-box", kind="ssh", host="cpu-box")


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _pane_text(scenario: str) -> str:
    async def go() -> str:
        app = DFlashApp(TARGET, connect=False, clock=lambda: NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            for e in events(f"recorded/{scenario}.jsonl"):
                app.feed(typed_event(e))
            pane = app.query_one(QueuePane)
            deadline = time.monotonic() + 10
            text = ""
            while time.monotonic() < deadline:
                console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
                console.print(pane.content)
                text = console.export_text()
                if "q_hs" in text:
                    break
                await pilot.pause(0.1)
            return text

    return asyncio.run(go())


def test_a_shared_run_shows_one_q_pre_and_one_q_hs_for_all():
    text = _pane_text("shared_routing")
    rows = [ln.split()[0] for ln in text.splitlines() if ln.strip()]
    assert rows == ["q_pre", "q_hs"], text
    assert "all targets" in text and "all drafters" in text
    assert "/16" in text  # the room of the 2 × 2 private queues, in one


def test_a_fixed_run_shows_a_queue_per_target_and_per_drafter():
    text = _pane_text("thread_straggler")
    rows = [ln.split()[0] for ln in text.splitlines() if ln.strip()]
    assert rows == ["q_pre[0]", "q_pre[1]", "q_hs[0]", "q_hs[1]"], text
    assert "all drafters" not in text
