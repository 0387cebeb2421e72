"""The rules that say where the pipeline waits, with stage times (ThreadInfo.stages_ms) in
the heartbeat: what they change in the verdict and in the evidence. The scenarios without
stage times (older trainers, the fixtures recorded before) keep their verdicts:
test_diagnosis_rules.py. Loader and edits: test_diagnosis.py.

The GPU figures are the H200 run's (an 8B target on one GPU, target-bound, ~266 ms a step)
put on the 8-GPU scenario's threads; the CPU ones are recorded (recorded/stage_times.jsonl).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitor_helpers import typed_event
from test_diagnosis import (
    Clock,
    Edit,
    Events,
    codes,
    hb,
    only,
    queues,
    run,
    thread,
    util,
)

from dflash_tui.diagnosis import diagnose
from dflash_tui.state import Store

HEARTBEATS = Path(__file__).resolve().parents[1] / "fixtures" / "heartbeats"
# A drafter that waits 58 % of its 266 ms step for the target's features …
STARVED_DRAFTER = {
    "wait q_hs": 154.0,
    "forward": 56.0,
    "backward": 50.0,
    "wait replicas": 3.0,
    "optimizer": 3.0,
}
# … fed by a target whose forward takes 251 ms of its 262 ms loop.
BUSY_TARGET = {
    "wait q_pre": 0.03,
    "forward": 251.0,
    "transfer": 3.0,
    "mask": 8.0,
    "wait q_hs": 0.05,
}
TARGETS = [f"target-{i}" for i in range(5)]
DRAFTERS = [f"drafter-{i}" for i in range(3)]


def stages(by_thread: dict[str, dict[str, float]]) -> Edit:
    """Stage times on the last heartbeat's threads (JSON order: sorted, as the trainer's)."""

    def edit(evs: Events) -> None:
        for t in hb(evs)["threads"]:
            if t["name"] in by_thread:
                t["stages_ms"] = dict(sorted(by_thread[t["name"]].items()))

    return edit


def each(names: list[str], ms: dict[str, float], **changed: dict[str, float]) -> dict[str, Any]:
    return {n: {**ms, **changed.get(n.replace("-", "_"), {})} for n in names}


def drafter_wait(ms: float) -> dict[str, float]:
    """A starved drafter's step with `ms` of wait q_hs (its work as STARVED_DRAFTER's)."""
    return {**STARVED_DRAFTER, "wait q_hs": ms}


TARGET_BOUND = stages(
    {
        **each(TARGETS, BUSY_TARGET),
        "drafter-0": STARVED_DRAFTER,
        "drafter-1": drafter_wait(136.0),  # 55 % of its 248 ms step
        "drafter-2": drafter_wait(130.0),  # 54 % of 242 ms
    }
)


# -- the targets: drafters waiting for features ----------------------------------------------
def test_drafters_waiting_on_gpus_of_their_own_make_the_targets_the_bottleneck() -> None:
    """Their GPUs at 41 % say little to the queue-depth rule (idle is <= 10 %); the stage
    times say the drafters' streams wait more than half of every step on q_hs."""
    busy_gpus = util(gpu5=41, gpu6=41, gpu7=41)
    assert run("healthy_gpu.jsonl", busy_gpus) == []  # the verdict before stage times
    f = only(run("healthy_gpu.jsonl", busy_gpus, TARGET_BOUND), "targets_bottleneck")
    assert f.title == "targets are the bottleneck"
    assert f.evidence == (
        "drafter-0 waits 58% of its 266 ms step on q_hs (drafter-1 55%, drafter-2 54%); "
        "target-0's forward takes 251 ms of its 262 ms loop; q_hs 12/20 11/20 10/20; "
        "drafter GPUs 5 41%, 6 41%, 7 41%"
    )


def test_drafters_waiting_less_than_the_threshold_are_no_bottleneck() -> None:
    # 39 % on average: 72 ms of 184, 71 of 183, 70 of 182 (40 % is the line)
    just_below = stages(
        {
            **each(TARGETS, BUSY_TARGET),
            "drafter-0": drafter_wait(72.0),
            "drafter-1": drafter_wait(71.0),
            "drafter-2": drafter_wait(70.0),
        }
    )
    assert run("healthy_gpu.jsonl", util(gpu5=41, gpu6=41, gpu7=41), just_below) == []


def test_a_shared_gpu_stays_busy_while_the_drafter_waits() -> None:
    """The H200 case itself: every role on cuda:0. The drafter's stream waits 58 % on q_hs
    while the target's stream keeps the GPU busy: that is how a one-GPU run is, no finding."""
    names = ["target-0", "target-1"]
    one_gpu = stages(
        {**each(names, BUSY_TARGET), "drafter-0": STARVED_DRAFTER, "drafter-1": STARVED_DRAFTER}
    )
    assert run("recorded/healthy_h200.jsonl", one_gpu) == []


# -- the drafters: targets blocked on a full q_hs ---------------------------------------------
def test_targets_blocked_on_a_full_q_hs_make_the_drafters_the_bottleneck() -> None:
    """q_hs and q_pre half full and the targets' GPUs at 55 %: the queue-depth rule waits
    for idle GPUs; the targets' streams wait 45 % of their loop to hand features over."""
    blocked = {"wait q_pre": 0.03, "forward": 140.0, "transfer": 3.0, "mask": 8.0}
    busy_drafter = {"wait q_hs": 0.1, "forward": 130.0, "backward": 135.0, "optimizer": 10.0}
    edit = stages(
        {**each(TARGETS, {**blocked, "wait q_hs": 124.0}), **each(DRAFTERS, busy_drafter)}
    )
    half = util(gpu0=55, gpu1=55, gpu2=55, gpu3=55, gpu4=55)
    assert run("healthy_gpu.jsonl", half) == []
    f = only(run("healthy_gpu.jsonl", half, edit), "drafters_bottleneck")
    assert f.evidence.startswith(
        "target-0 waits 45% of its 275 ms loop on q_hs (target-1 45%, target-2 45%, target-3"
        " 45%, …); drafter-0's backward takes 135 ms of its 275 ms step; q_hs 12/20 11/20 10/20"
    ), f.evidence
    assert f.evidence.endswith("target GPUs 0 55%, 1 55%, 2 55%, 3 55%, 4 55%")


# -- data prefetch: targets waiting for batches -----------------------------------------------
def test_targets_waiting_on_q_pre_make_prefetch_the_bottleneck() -> None:
    """q_pre not empty in every sample (1 0 1 0 1): the queue-depth rule says nothing; the
    targets wait 59 % of their loop for a batch while prefetch builds all of its loop."""
    starved = {"wait q_pre": 160.0, "forward": 100.0, "transfer": 3.0, "mask": 8.0}
    edit = stages(
        {
            **each(TARGETS, {**starved, "wait q_hs": 0.05}),
            "prefetch-0": {"build batch": 270.0, "wait q_pre": 0.2},
        }
    )
    nearly_empty = queues(q_pre=[1, 0, 1, 0, 1])
    assert run("healthy_gpu.jsonl", nearly_empty) == []
    f = only(run("healthy_gpu.jsonl", nearly_empty, edit), "prefetch_bottleneck")
    assert f.evidence.startswith(
        "target-0 waits 59% of its 271 ms loop on q_pre (target-1 59%, target-2 59%, target-3"
        " 59%, …); prefetch-0's build batch takes 270 ms of its 270 ms loop; q_pre 1/8 0/8"
    ), f.evidence


# -- Python: a GPU stream idle between kernels ------------------------------------------------
def test_a_stream_waiting_for_python_is_not_the_targets_fault() -> None:
    """q_hs empty and the drafters' GPUs at 3 %: from the queues, the targets are slow. The
    stage times say the drafters hardly wait for features (5 %) and their streams idle 47 % of
    each step between kernels: Python launching them is the bottleneck."""
    empty, idle = queues(q_hs=[2, 2, 2]), util(gpu5=3, gpu6=3, gpu7=3)
    assert codes(run("healthy_gpu.jsonl", empty, idle)) == ["targets_bottleneck"]
    launch_bound = {"wait q_hs": 2.0, "forward": 10.0, "host": 20.0, "backward": 10.0}
    edit = stages({**each(TARGETS, BUSY_TARGET), **each(DRAFTERS, launch_bound)})
    f = only(run("healthy_gpu.jsonl", empty, idle, edit), "host_bottleneck")
    assert f.title == "drafters' GPUs wait for Python"
    assert f.evidence == (
        "drafter-0 waits 48% of its 42 ms step on the host (Python) (drafter-1 48%, drafter-2"
        " 48%); its stream idles between the kernels its Python thread launches; drafter GPUs"
        " 5 3%, 6 3%, 7 3%"
    )


# -- the CPU demo: recorded with stage times ----------------------------------------------------
def test_a_stall_is_judged_from_the_threads_states_and_the_loops_still_timed() -> None:
    """Both drafters blocked on q_hs for 31 s: their medians are of the loops before (they
    have not finished this one), so the queue-depth rule decides, as before stage times, and
    the evidence adds the stage times of the threads still looping: the targets'."""
    blocked = [thread(f"drafter-{r}", "waiting: q_hs empty", 31) for r in (0, 1)]
    f = only(run("recorded/stage_times.jsonl", queues(q_hs=[0, 0]), *blocked), "targets_bottleneck")
    assert f.evidence == (
        "drafter-0, drafter-1 waiting: q_hs empty for 31s+; q_hs 0/8 0/8 (all 7 samples over "
        "47s); q_pre 8/8 8/8; stage times: target-0's forward takes 464 ms of its 590 ms loop"
    )
    assert run("recorded/stage_times.jsonl", queues(q_hs=[0, 0]), *(
        thread(f"drafter-{r}", "waiting: q_hs empty", 29) for r in (0, 1))) == []  # fmt: skip


def test_a_stuck_target_is_one_busy_for_many_of_its_loops() -> None:
    """target-1's loop takes 575 ms: in 'forward' for 31 s is 54 of them (the floor is 30 s).
    Without stage times the rule waits a minute (test_cpu_stuck_target)."""
    f = only(run("recorded/stage_times.jsonl", thread("target-1", "forward", 31)), "target_stuck")
    assert f.evidence == (
        "target-1 'forward' for 31s, its loop 575 ms (forward 427 ms); q_pre 8/8 "
        "(all 7 samples over 47s)"
    )
    assert run("recorded/stage_times.jsonl", thread("target-1", "forward", 29)) == []
    assert run("recorded/healthy.jsonl", thread("target-1", "forward", 31)) == []


def test_a_longer_loop_needs_longer_to_be_stuck() -> None:
    """A 5 s loop (a long bucket on the CPU): 61 s in 'forward' is 12 loops, not stuck; the
    minute that held without stage times does not."""
    slow = stages({"target-1": {"wait q_pre": 0.1, "forward": 4800.0, "mask": 200.0}})
    assert run("recorded/stage_times.jsonl", slow, thread("target-1", "forward", 61)) == []
    found = run("recorded/stage_times.jsonl", slow, thread("target-1", "forward", 101))
    assert "its loop 5.0 s (forward 4.8 s)" in only(found, "target_stuck").evidence


# -- compiling: against the compile cache's history -------------------------------------------
def compiling_store(in_phase_s: float) -> Store:
    """The recorded compiling heartbeat (compiling-gpu.json), `in_phase_s` into the phase,
    no earlier runs in the runs list."""
    data = json.loads((HEARTBEATS / "compiling-gpu.json").read_text())
    data["phase_started_at"] = data["now"] - in_phase_s
    t = data["now"]
    s = Store("local", clock=Clock(t))
    for e in (
        {"type": "follow", "t": t, "run_id": data["run_id"], "run_dir": "/runs/x"},
        {"type": "heartbeat", "t": t, "run_id": data["run_id"], "data": data},
    ):
        s.apply(typed_event(e))
    return s


def test_compiling_slower_than_the_cache_remembers() -> None:
    """No earlier run to compare with, but the compile cache says the same graphs took
    30.6 s: 100 s in is more than twice that and a minute more."""
    s = compiling_store(100)
    (f,) = diagnose(s, s.clock())
    assert (f.code, f.title) == ("slow_phase", "compiling slower than last time")
    assert f.evidence == (
        "1m40s so far; the compile cache's history: graphs 3/6: graph 4: forward of 2/0, "
        "bucket 4096 on cuda:0, 12s; last time 30.6s with an empty cache"
    )
    s = compiling_store(90)  # 59.4 s more than last time: within the margin
    assert diagnose(s, s.clock()) == []


def test_slow_compile_evidence_says_the_graphs() -> None:
    """The recorded slow compile (an older trainer: `1/3 buckets`) with the progress a
    trainer that counts graphs writes: the evidence names them and the cache's last time."""

    def graphs(evs: Events) -> None:
        data = hb(evs)
        data["phase_progress"] = {"done": 3, "total": 6, "unit": "graphs"}
        data["compile"].update(
            current="graph 4: backward of 1/0, bucket 256 on cpu",
            current_since=data["now"] - 5,
            done=3,
            expected=6,
            last_s=0.9,
            last_cache="warm",
        )

    (f,) = run("recorded/slow_compile.jsonl", graphs)
    assert f.title == "compiling slower than usual"
    assert f.evidence.endswith(
        "; graphs 3/6: graph 4: backward of 1/0, bucket 256 on cpu, 5s; last time 0.9s with a "
        "warm cache"
    ), f.evidence


def test_a_stuck_target_under_shared_routing_is_held_against_the_one_q_pre() -> None:
    """runtime.routing = "shared" (a real run's heartbeat, one q_pre for both targets): a
    full q_pre with target-1 in 'forward' for 101 s (its loop 3.3 s: 30 of them) names
    target-1, and the queue as the one every target takes from; target-0 working is not."""
    found = run(
        "recorded/shared_routing.jsonl", queues(q_pre=[16]), thread("target-1", "forward", 101)
    )
    f = only(found, "target_stuck")
    assert f.title == "target 1 idle with a full q_pre"
    assert f.evidence.startswith("target-1 'forward' for 1m41s, its loop 3.3 s (forward 3.2 s)")
    assert "q_pre 16/16 (shared by every target)" in f.evidence
    assert "target_stuck" not in codes(run("recorded/shared_routing.jsonl", queues(q_pre=[16])))
