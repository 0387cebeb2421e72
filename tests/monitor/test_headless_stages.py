"""The headless views of stage times and compile progress, through the real agent on real
CPU runs of the trainer (deploy and launch through the CLI, as an operator does it)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from monitor_helpers import NO_WANDB, TINY, cli

PIPELINE = {"prefetch-0", "prefetch-1", "target-0", "target-1", "drafter-0", "drafter-1"}
# The busiest thread's largest stage, last on the line, in the longest form that fits:
# `drafter-0 backward 49% of 452ms`, `D0 backward 49%`, `D0 backward`.
BUSIEST = re.compile(
    r" \| ((?:prefetch|target|drafter)-\d|[PTD]\d) (build batch|forward|backward|mask|"
    r"transfer|optimizer)( \d+%( of \d+(\.\d)?m?s)?)?$"
)


def heartbeat(run_dir: Path, ready: Any, what: str, timeout: float = 120) -> dict[str, Any]:
    """The run's heartbeat.json once `ready(heartbeat)`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            hb: dict[str, Any] = json.loads((run_dir / "heartbeat.json").read_text())
        except (OSError, ValueError):  # not there yet, or replaced as it was read
            hb = {}
        if hb and ready(hb):
            return hb
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def timed(hb: dict[str, Any]) -> bool:
    return {t["name"] for t in hb["threads"] if t.get("stages_ms")} >= PIPELINE


# The stage times of a live run are read in test_monitor_cli.py
# (test_status_carries_each_threads_stages_in_loop_order), from the run its module fixture
# keeps for its readers: a second live run for this one test took ~39 s to start.


def test_status_says_the_graphs_while_compiling(tmp_path):
    """A run held in compiling (DFLASH_FAULT=slow:compile, as a cold cache holds it) with a
    compile cache of its own: its first compile, so no total is known."""
    remote = str(tmp_path / "remote")
    where = ["local", "--remote-dir", remote]
    assert cli("deploy", *where).returncode == 0
    r = cli(
        "launch",
        *where,
        "--config",
        str(TINY),
        "--set",
        NO_WANDB,
        "--set",
        f"runtime.compile_cache_dir={tmp_path / 'compile-cache'}",
        env={"DFLASH_FAULT": "slow:compile:45"},
    )
    assert r.returncode == 0, r.stderr
    run_dir = Path(r.stdout.split(" in ")[1].split()[0])
    try:
        # The heartbeat written at the phase change comes before the count is set up.
        heartbeat(run_dir, lambda hb: hb["phase"] == "compiling" and hb["phase_progress"], "graphs")
        line = cli("status", *where).stdout.splitlines()[0]
        assert re.match(r"\d\d:\d\d:\d\d compiling \d+s graphs 0 \| step 0 \|", line), line
        state = json.loads(cli("status", *where, "--json").stdout.splitlines()[0])["state"]
        assert state["phase"] == "compiling"
        comp = state["compile"]
        assert (comp["done"], comp["expected"], comp["last_s"], comp["current"]) == (
            0,
            None,
            None,
            None,
        )
        assert state["phase_progress"]["unit"] == "graphs"
        assert state["phase_progress"]["total"] is None
        assert state["stages"] == [] and state["busiest"] is None
    finally:
        # Clean-up only: the held compile sleeps through SIGTERM, so the kill ends in SIGKILL
        # at its timeout whatever it is (20 s of nothing, with 20).
        cli("kill", *where, "--timeout", "2")


def test_the_line_keeps_its_width_and_the_finding_before_the_stage():
    """The recorded stage-times scenario's line at widths around what it needs: the stage in
    the longest form that fits, and only after room for the first finding's title."""
    from test_diagnosis import NOW, events, store

    from dflash_tui.diagnosis import Finding
    from dflash_tui.headless import status_line
    from dflash_tui.link.events import LinkStatus

    s = store(events("recorded/stage_times.jsonl"))
    s.apply(LinkStatus(t=NOW, state="connected", detail="", target="local"))
    wide = status_line(s, [], now=NOW, width=200)
    base = wide.removesuffix(" | drafter-0 backward 53% of 581ms")
    assert base.endswith(" | no NVIDIA GPU | hb 0.0s") and base != wide, wide
    for form in ("D0 backward 53%", "D0 backward"):
        width = len(base) + 3 + len(form)
        assert status_line(s, [], now=NOW, width=width) == f"{base} | {form}"
    assert status_line(s, [], now=NOW, width=len(base) + 3 + 10) == base
    title = Finding("warning", "x", "drafters are the bottleneck", "", "")
    both = status_line(s, [title], now=NOW, width=200)
    assert both == f"{wide} | ! drafters are the bottleneck"
    # No room for the title whole: the line leaves it out, and status_text puts it under
    # the line, never cut mid-word (issue 16: headless alerts were cut to "n…").
    from dflash_tui.headless import status_text

    at_120 = status_line(s, [title], now=NOW)
    assert at_120 == base, at_120  # no room for the stage either, at 120
    line, alert = status_text(s, [title], now=NOW).split("\n")
    assert (line, alert) == (at_120, "  ! drafters are the bottleneck")
