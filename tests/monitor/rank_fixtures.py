"""A store fed what a monitor following a real processes-mode job receives: the job's
heartbeat and each rank's heartbeat-rank{R}.json, as recorded in tests/fixtures/ranks/
(tests/infra/record_rank_heartbeats.py; its README lists the scenarios)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor_helpers import typed_event

from dflash_tui.state import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ranks"
Beats = dict[int, dict[str, Any]]


def recorded(name: str) -> tuple[dict[str, Any], Beats]:
    """(the job's heartbeat.json, {rank: heartbeat-rank{R}.json}) of scenario `name`."""
    d = FIXTURES / name
    job = json.loads((d / "heartbeat.json").read_text())
    ranks = {}
    for f in sorted(d.glob("heartbeat-rank*.json")):
        beat = json.loads(f.read_text())
        ranks[beat["rank"]] = beat
    return job, ranks


def events(name: str, *edits: Callable[[Beats], None]) -> list[dict[str, Any]]:
    """The events of scenario `name` as the agent sends them, after `edits` of the ranks."""
    job, ranks = recorded(name)
    for edit in edits:
        edit(ranks)
    run_id, t = job["run_id"], job["now"]
    evs: list[dict[str, Any]] = [
        {"type": "follow", "t": t, "run_id": run_id, "run_dir": f"/runs/{run_id}"},
        {"type": "heartbeat", "t": t, "run_id": run_id, "data": job},
        {"type": "liveness", "t": t, "run_id": run_id, "alive": True},
    ]
    for rank, beat in sorted(ranks.items()):
        evs.append({"type": "rank_heartbeat", "t": t, "run_id": run_id, "rank": rank, "data": beat})
    return evs


def now_of(name: str) -> float:
    """The moment of the recording: the job heartbeat's own time."""
    return float(recorded(name)[0]["now"])


def rank_store(name: str, *edits: Callable[[Beats], None]) -> Store:
    """A store that has received scenario `name`, its clock at the recording's moment."""
    t = now_of(name)
    s = Store("cpu-box", clock=lambda: t)
    for e in events(name, *edits):
        s.apply(typed_event(e))
    return s
