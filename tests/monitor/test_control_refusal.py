"""Which control keys the monitor refuses before asking the agent (dflash_tui/offline.py), on
the recorded healthy run's events: refused only when the run is known to be dead, never in
the seconds after attaching while the header already says `training` (the agent proves the
pid before it signals anything)."""

from __future__ import annotations

from test_diagnosis import events, of_type, store

from dflash_tui.link.events import LinkStatus
from dflash_tui.offline import control_refusal


def attached(*drop: str, dead: bool = False):
    """The healthy scenario over a connected link, without the event types in `drop`
    (what has not come yet); `dead`: its liveness says the process is gone."""
    evs = [e for e in events("healthy_gpu.jsonl") if e["type"] not in drop]
    if dead:
        for e in of_type(evs, "liveness"):
            e["alive"] = False
        for e in of_type(evs, "runs"):
            for r in e["runs"]:
                r["alive"] = False
            e["alive_run"] = None
    s = store(evs)
    s.apply(LinkStatus("connected", target="gpu-box"))
    return s


def test_just_attached_the_header_says_training_and_kill_is_not_refused():
    s = attached("runs", "liveness")  # the follow and heartbeat came first
    assert s.heartbeat is not None and s.heartbeat.phase == "training"
    assert s.alive_run is None and s.process_alive() is None
    for action in ("kill", "dump stacks", "restart"):
        assert control_refusal(s, action) is None, action


def test_a_run_known_dead_is_refused_with_where_it_looked():
    s = attached(dead=True)
    why = control_refusal(s, "kill")
    assert why is not None and why.startswith("kill: no run is alive under /workspace/runs")
    assert control_refusal(s, "dump stacks") is not None
    assert control_refusal(s, "restart") is None  # restart launches the followed run again


def test_the_runs_list_saying_none_is_alive_refuses_before_the_liveness_comes():
    s = attached("liveness", dead=True)
    assert s.runs_received and s.process_alive() is False  # the runs list's own word
    assert control_refusal(s, "kill") is not None
