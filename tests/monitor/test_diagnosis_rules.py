"""Each diagnosis rule on variations of the recorded scenarios: firing, and not firing just
below its threshold. Loader and edits: test_diagnosis.py."""

from __future__ import annotations

import copy
import json
from typing import Any

from monitor_helpers import typed_event
from test_diagnosis import (
    BASELINE,
    NOW,
    Clock,
    Events,
    codes,
    edit_metrics,
    events,
    hb,
    heartbeat,
    metrics_records,
    of_type,
    only,
    queues,
    run,
    store,
    thread,
    util,
)

from dflash_tui.diagnosis import DiagnosisConfig, diagnose, phase_expectation
from dflash_tui.state import Store

GIB = 1 << 30
MIB = 1 << 20


def gpu_mem(index: int, mib: int) -> Any:
    def edit(evs: Events) -> None:
        for g in of_type(evs, "gpu"):
            g["devices"][index]["mem_used"] = mib * MIB

    return edit


class Live:
    """A store fed heartbeat after heartbeat, diagnosed after each as a view does (the
    findings do not depend on it: test_history.py)."""

    def __init__(self, name: str, *edits: Any) -> None:
        self.evs = events(name)
        for edit in edits:
            edit(self.evs)
        self.clock = Clock(NOW)
        self.s = Store("gpu-box", clock=self.clock)
        for e in self.evs:
            self.s.apply(typed_event(e))
        self.found = diagnose(self.s, NOW)

    def beat(self, after_s: float, **fields: Any) -> list[Any]:
        """A new heartbeat `after_s` later with `fields` changed (nested dicts merged)."""
        last = copy.deepcopy(of_type(self.evs, "heartbeat")[-1])
        self.clock.t += after_s
        t = self.clock.t
        data = last["data"]
        data["now"] = last["t"] = t
        data["last_step_at"] = t - 0.5
        for k, v in fields.items():
            data[k] = {**data[k], **v} if isinstance(v, dict) else v
        self.evs.append(last)
        self.s.apply(typed_event(last))
        self.s.apply(
            typed_event({"type": "liveness", "t": t, "run_id": last["run_id"], "alive": True})
        )
        self.found = diagnose(self.s, t)
        return self.found


# -- the existing rules keep their behaviour -----------------------------------------------
def test_unreachable_and_refused() -> None:
    s = store(events("healthy_gpu.jsonl"))
    s.apply(
        typed_event({"type": "link", "state": "reconnecting", "detail": "timed out", "attempt": 2})
    )
    assert (diagnose(s, NOW)[0].code, diagnose(s, NOW)[0].title) == (
        "unreachable",
        "cannot reach gpu-box",
    )
    s.apply(
        typed_event({"type": "link", "state": "refused", "detail": "Permission denied (publickey)"})
    )
    top = diagnose(s, NOW)[0]
    assert (top.code, top.evidence) == ("link_refused", "Permission denied (publickey)")


def test_crashed_with_the_trainer_error() -> None:
    error = {"thread": "drafter-1", "message": "RuntimeError: CUDA error", "traceback": "…"}
    found = run("healthy_gpu.jsonl", heartbeat(phase="crashed", error=error, exit_code=1))
    f = only(found, "crashed")
    assert (f.title, f.evidence) == ("run crashed in drafter-1 (exit code 1)", error["message"])


def test_crashed_without_error_says_where_and_the_logs_last_words() -> None:
    # died_before_start.jsonl made a run that crashed after its first step line (exit 2).
    def started(evs: Events) -> None:
        first = of_type(evs, "line")[0]
        text = (
            "[0m] step=10 loss=11.6682 acc=0.013 streak=1.0 lr=1.50e-03 noise=0.0000 | "
            "tgt=15.27b/s dft=10.18b/s (2.4Ktok/s) | q_pre=[8, 8] q_hs=[4, 4] | epoch~0.05 ETA=6.5m"
        )
        evs.insert(evs.index(first), {**first, "text": text})

    # The trainer's own one-line error when it wrote one: it *was* recorded, in the log …
    f = only(run("recorded/died_before_start.jsonl", started), "crashed")
    assert f.title == "run crashed (exit code 2)"
    assert f.evidence == "error: train.lr: expected a number, got 'abc'"

    # … else the logs' last two lines that are not step lines.
    def no_error_line(evs: Events) -> None:
        for e in of_type(evs, "line"):
            if e["text"].startswith("error"):
                evs.remove(e)

    f = only(run("recorded/died_before_start.jsonl", started, no_error_line), "crashed")
    assert f.evidence.startswith("no error recorded; ")
    assert "wrapper pid 4002: /usr/bin/python3 -m trainer --config" in f.evidence
    assert f.evidence.endswith("trainer exited: exit code 2")


def test_a_run_that_died_before_start_gets_one_alert_that_says_to_fix_it() -> None:
    """Not `crashed` beside it ("no error recorded; error: …", restart as it was): one
    alert, the error line first, the advice to fix the override (r) or the config."""
    (f,) = run("recorded/died_before_start.jsonl")
    assert (f.code, f.title) == ("died_at_start", "the run exited before its first step")
    assert f.evidence.startswith("error: train.lr: expected a number, got 'abc' | ")
    assert "no error recorded" not in f.evidence
    assert f.action.startswith("fix what the error names")
    assert "restart (r) lets you drop or edit the launch's overrides (i lists them)" in f.action


def test_died_before_log_needs_no_step_line_and_an_unclean_exit() -> None:
    assert "died_at_start" in codes(run("recorded/died_before_start.jsonl"))

    def clean(evs: Events) -> None:
        for e in of_type(evs, "liveness"):
            e["exit"] = {"run_id": e["run_id"], "exit_code": 0, "error": None}

    assert "died_at_start" not in codes(run("recorded/died_before_start.jsonl", clean))


def test_stale_heartbeat_after_three_intervals() -> None:
    def aged(age: float) -> Any:
        return heartbeat(now=NOW - age)

    assert "stale_heartbeat" not in codes(run("healthy_gpu.jsonl", aged(6.0)))
    f = only(run("healthy_gpu.jsonl", aged(6.5)), "stale_heartbeat")
    assert f.title == "process hung or dead" and "heartbeat is 6s old (pid 4242" in f.evidence


def test_stalled_loop_after_two_minutes_without_a_step() -> None:
    def no_step_for(s: float) -> Any:
        return heartbeat(last_step_at=NOW - 0.5 - s)

    assert "loop_stalled" not in codes(run("healthy_gpu.jsonl", no_step_for(119)))
    f = only(
        run("healthy_gpu.jsonl", no_step_for(121), thread("target-3", "forward", 125)),
        "loop_stalled",
    )
    assert f.title == "training loop stalled in target-3 (forward for 2m05s)"
    assert "no step for 2m01s (step 20482)" in f.evidence


def test_output_buffered_after_a_minute() -> None:
    def training_for(s: float) -> Any:
        def edit(evs: Events) -> None:
            hb(evs)["phase_history"][-1]["started_at"] = NOW - s

        return edit

    assert "output_buffered" in codes(run("wandb_only.jsonl", training_for(61)))
    assert "output_buffered" not in codes(run("wandb_only.jsonl", training_for(59)))


# -- slow_phase ---------------------------------------------------------------------------
def test_slow_phase_twice_the_usual() -> None:
    # median 4m12s: 2 × 252 s = 504 s is the bar
    assert run("slow_compile.jsonl", heartbeat(phase_started_at=NOW - 503)) == []
    f = only(run("slow_compile.jsonl", heartbeat(phase_started_at=NOW - 505)), "slow_phase")
    assert f.evidence.startswith("8m25s so far; 4m12s last time")


def test_slow_phase_needs_a_margin_for_short_phases() -> None:
    # loading data took 21 s before: 50 s is 2.4× but only 29 s more
    loading = heartbeat(phase="loading_data", phase_started_at=NOW - 50)
    assert run("slow_compile.jsonl", loading) == []
    f = only(
        run("slow_compile.jsonl", heartbeat(phase="loading_data", phase_started_at=NOW - 82)),
        "slow_phase",
    )
    assert f.title == "loading data slower than usual"
    assert f.evidence.startswith("1m22s so far; 21s last time")


def test_slow_phase_needs_earlier_runs_of_the_same_config() -> None:
    def other_config(evs: Events) -> None:  # comparable runs: trainer/contract/comparable.py
        signature = of_type(evs, "runs")[-1]["runs"][-1]["signature"]
        signature["shape"] = signature["shape"].replace("batch_size=8", "batch_size=16")

    assert run("slow_compile.jsonl", other_config) == []
    evs = events("slow_compile.jsonl")
    other_config(evs)
    assert phase_expectation(store(evs)) is None


def test_slow_phase_is_quiet_on_a_stale_heartbeat() -> None:
    assert codes(run("slow_compile.jsonl", heartbeat(now=NOW - 30))) == ["stale_heartbeat"]


# -- pipeline balance with GPUs -----------------------------------------------------------
def test_targets_bottleneck_on_gpus() -> None:
    empty = queues(q_hs=[2, 2, 2])  # 2/20: at the 10% "empty" line
    idle = util(gpu5=3, gpu6=9, gpu7=3)
    f = only(run("healthy_gpu.jsonl", empty, idle), "targets_bottleneck")
    assert "drafter GPUs 5 3%, 6 9%, 7 3%" in f.evidence
    assert "q_hs 2/20 2/20 2/20 (all 4 samples over 1m00s)" in f.evidence
    assert run("healthy_gpu.jsonl", empty, util(gpu5=11, gpu6=11, gpu7=11)) == []
    assert run("healthy_gpu.jsonl", queues(q_hs=[3, 2, 2]), idle) == []


def test_one_idle_sample_is_not_an_idle_gpu() -> None:
    def last_sample_idle(evs: Events) -> None:
        for d in of_type(evs, "gpu")[-1]["devices"][5:]:
            d["util"] = 0

    assert run("healthy_gpu.jsonl", queues(q_hs=[0, 0, 0]), last_sample_idle) == []


def test_queues_must_hold_in_every_recent_sample() -> None:
    empty_now = queues(q_hs=[0, 0, 0])

    def not_empty_a_minute_ago(evs: Events) -> None:
        edit_metrics(evs, lambda m: m.update(q_hs=[9, 9, 9]) if m["step"] == 20460 else None)

    idle = util(gpu5=0, gpu6=0, gpu7=0)
    assert run("healthy_gpu.jsonl", empty_now, not_empty_a_minute_ago, idle) == []
    # … unless that sample is older than the window
    narrow = DiagnosisConfig(queue_window_s=45)
    found = run("healthy_gpu.jsonl", empty_now, not_empty_a_minute_ago, idle, config=narrow)
    assert "(all 3 samples over 30s)" in only(found, "targets_bottleneck").evidence


def test_drafters_bottleneck_on_gpus() -> None:
    idle_targets = util(gpu0=4, gpu1=4, gpu2=4, gpu3=4, gpu4=4)
    blocked = [thread(f"target-{t}", "waiting: q_hs full", 3) for t in range(5)]
    backed_up = queues(q_pre=[7, 4, 8, 6, 5], q_hs=[10, 10, 10])
    f = only(run("healthy_gpu.jsonl", backed_up, idle_targets, *blocked), "drafters_bottleneck")
    assert f.title == "drafters are the bottleneck"
    assert "target GPUs 0 4%, 1 4%, 2 4%, 3 4%, 4 4%" in f.evidence
    assert "q_hs 10/20 10/20 10/20 (all 4 samples over 1m00s)" in f.evidence
    just_below = queues(q_pre=[7, 4, 8, 6, 5], q_hs=[10, 10, 9])
    assert run("healthy_gpu.jsonl", just_below, idle_targets, *blocked) == []
    # targets idle for want of input (q_pre 3/8), not held back by the drafters
    starved = queues(q_pre=[7, 3, 8, 6, 5], q_hs=[10, 10, 10])
    assert run("healthy_gpu.jsonl", starved, idle_targets, *blocked) == []


def test_prefetch_bottleneck_on_gpus() -> None:
    idle_targets = util(gpu0=2, gpu1=2, gpu2=2, gpu3=2, gpu4=2)
    f = only(run("healthy_gpu.jsonl", queues(q_pre=[0] * 5), idle_targets), "prefetch_bottleneck")
    assert f.title == "data prefetch is the bottleneck"
    assert "q_pre 0/8 0/8 0/8 0/8 0/8" in f.evidence
    assert "prefetch-0 'building batch' 18% CPU" in f.evidence
    assert run("healthy_gpu.jsonl", queues(q_pre=[0, 0, 1, 0, 0]), idle_targets) == []


def test_stuck_target_on_gpus() -> None:
    full = queues(q_pre=[4, 8, 5, 4, 5])
    in_forward = thread("target-1", "forward", 31)  # one state for the whole 30 s window
    f = only(run("healthy_gpu.jsonl", full, util(gpu1=5), in_forward), "target_stuck")
    assert f.title == "target 1 idle with a full q_pre"
    assert "target-1 on GPU 1 at 5%, 'forward' for 31s" in f.evidence
    assert "q_pre 8/8" in f.evidence
    assert run("healthy_gpu.jsonl", queues(q_pre=[4, 7, 5, 4, 5]), util(gpu1=5), in_forward) == []
    assert run("healthy_gpu.jsonl", full, util(gpu1=11), in_forward) == []
    # blocked on a full q_hs: the drafters are slow, the target is not stuck
    blocked = thread("target-1", "waiting: q_hs full", 40)
    assert run("healthy_gpu.jsonl", full, util(gpu1=5), blocked) == []
    # A thread that moved on within the window works: a small model keeps its GPU near idle
    # (the tiny GPU config on an H200: 8 %, recorded in recorded/healthy_h200.jsonl).
    assert run("healthy_gpu.jsonl", full, util(gpu1=5), thread("target-1", "forward", 29)) == []


def test_pipeline_rules_only_while_training() -> None:
    warmup = heartbeat(phase="warmup")
    assert run("gpu_imbalance.jsonl", warmup) == []


# -- pipeline balance without GPUs (the CPU demo) -----------------------------------------
def test_cpu_targets_bottleneck_from_thread_states() -> None:
    empty = queues(q_hs=[0, 0])

    def drafters_waiting(s: float) -> list[Any]:
        return [thread(f"drafter-{r}", "waiting: q_hs empty", s) for r in (0, 1)]

    f = only(run("recorded/healthy.jsonl", empty, *drafters_waiting(31)), "targets_bottleneck")
    assert "drafter-0, drafter-1 waiting: q_hs empty for 31s+" in f.evidence
    assert "q_hs 0/8 0/8 (all 10 samples over 13s)" in f.evidence
    assert run("recorded/healthy.jsonl", empty, *drafters_waiting(29)) == []
    # round-robin: drafter-1 starves, drafter-0 waits for it at the replicas' barrier
    barrier = thread("drafter-0", "waiting for replicas", 40)
    starving = thread("drafter-1", "waiting: q_hs empty", 40)
    f = only(
        run("recorded/healthy.jsonl", queues(q_hs=[0, 0]), barrier, starving),
        "targets_bottleneck",
    )
    assert "drafter-0 waiting for replicas, drafter-1 waiting: q_hs empty for 40s+" in f.evidence
    working = thread("drafter-0", "backward", 40)
    assert run("recorded/healthy.jsonl", queues(q_hs=[0, 0]), working, starving) == []


def test_cpu_drafters_bottleneck() -> None:
    def targets_blocked(s: float) -> list[Any]:
        return [thread(f"target-{t}", "waiting: q_hs full", s) for t in (0, 1)]

    # q_hs 4/8 is as full as it gets with 2 targets and 2 drafters (each fed by one target)
    f = only(run("recorded/healthy.jsonl", *targets_blocked(45)), "drafters_bottleneck")
    assert "target-0, target-1 waiting: q_hs full for 45s+" in f.evidence
    assert "q_hs 4/8 4/8" in f.evidence
    assert run("recorded/healthy.jsonl", *targets_blocked(29)) == []
    assert run("recorded/healthy.jsonl", queues(q_hs=[4, 3]), *targets_blocked(45)) == []


def test_cpu_prefetch_bottleneck() -> None:
    starved = [thread(f"target-{t}", "waiting: q_pre empty", 40) for t in (0, 1)]
    f = only(run("recorded/healthy.jsonl", queues(q_pre=[0, 0]), *starved), "prefetch_bottleneck")
    assert "q_pre 0/8 0/8" in f.evidence and "prefetch-0 'waiting: q_pre full'" in f.evidence


def test_cpu_stuck_target() -> None:
    f = only(run("recorded/healthy.jsonl", thread("target-1", "forward", 61)), "target_stuck")
    assert f.title == "target 1 idle with a full q_pre"
    assert "target-1 'forward' for 1m01s" in f.evidence
    assert run("recorded/healthy.jsonl", thread("target-1", "forward", 59)) == []


# -- role memory --------------------------------------------------------------------------
def test_role_memory_short_against_earlier_runs() -> None:
    # drafters peaked at 79 GiB (median of the earlier runs that trained): the bar is 71.1 GiB
    f = only(run("healthy_gpu.jsonl", gpu_mem(6, 72_700)), "memory_short")
    assert f.title == "drafter on GPU 6 holds less memory than usual"
    assert f.evidence.startswith("GPU 6 71.0 GB; a drafter peaked at 79.0 GB")
    assert run("healthy_gpu.jsonl", gpu_mem(6, 72_900)) == []
    # targets too: 80 GiB median peak, GPU 4 (target + prefetch) counts as a target
    t = only(run("healthy_gpu.jsonl", gpu_mem(4, 70_000)), "memory_short")
    assert t.title == "target on GPU 4 holds less memory than usual"


def test_role_memory_ignores_runs_that_never_trained() -> None:
    def only_the_crashed_run(evs: Events) -> None:
        r = of_type(evs, "runs")[-1]
        r["runs"] = [x for x in r["runs"] if x["run_id"].endswith(("0003", "a1b2"))]

    assert "memory_short" not in codes(run("gpu_imbalance.jsonl", only_the_crashed_run))


# -- memory held after the run ended ------------------------------------------------------
def test_memory_held_names_the_pids() -> None:
    f = only(run("killed_held.jsonl"), "memory_held")
    assert f.title == "GPU memory held after the run ended"
    assert f.evidence == (
        "pid 4242 (the trainer): 78.5 GB on GPU 5, 77.5 GB on GPU 6; "
        "pid 51515 (not in this container): 12.0 GB on GPU 7"
    )
    assert f.action.startswith("kill -9 4242 51515")


def test_memory_held_waits_for_the_driver_and_ignores_crumbs() -> None:
    def sampled_after_exit(s: float) -> Any:
        def edit(evs: Events) -> None:
            of_type(evs, "gpu")[-1]["t"] = NOW - 30 + s

        return edit

    assert "memory_held" not in codes(run("killed_held.jsonl", sampled_after_exit(9)))
    assert "memory_held" in codes(run("killed_held.jsonl", sampled_after_exit(11)))

    def crumbs(evs: Events) -> None:
        for d in of_type(evs, "gpu")[-1]["devices"]:
            d["mem_used"] = min(d["mem_used"], 1023 * MIB)
            for p in d["processes"]:
                p["mem_used"] = 1000 * MIB

    assert "memory_held" not in codes(run("killed_held.jsonl", crumbs))


def test_memory_held_without_visible_processes() -> None:
    def hidden(evs: Events) -> None:
        for d in of_type(evs, "gpu")[-1]["devices"]:
            d["processes"] = []

    f = only(run("killed_held.jsonl", hidden), "memory_held")
    assert f.evidence.startswith("no visible process: 79.0 GB on GPU 5, 78.0 GB on GPU 6")
    assert "nvidia-smi on the host" in f.action


def test_no_memory_held_while_the_run_lives() -> None:
    assert "memory_held" not in codes(run("healthy_gpu.jsonl"))

    def newer_run_alive(evs: Events) -> None:
        evs.append({"type": "runs", "t": NOW, "runs": [], "alive_run": "20260520-101500-next"})

    assert "memory_held" not in codes(run("killed_held.jsonl", newer_run_alive))


# -- code_mismatch ------------------------------------------------------------------------
def test_running_old_code() -> None:
    def deployed(sha: str | None, at: float) -> Any:
        def edit(evs: Events) -> None:
            of_type(evs, "hello")[-1]["deployed"] = {"sha256": sha, "at": at} if sha else None

        return edit

    f = only(
        run("healthy_gpu.jsonl", deployed("1f2e3d4c5b6a" + "0" * 52, NOW - 600)), "code_mismatch"
    )
    assert (f.severity, f.title) == ("warning", "running old code")
    assert f.evidence == (
        "running 9cc00a7b620d, deployed 1f2e3d4c5b6a (30m00s after this run started)"
    )
    assert run("healthy_gpu.jsonl", deployed(None, 0)) == []
    assert run("healthy_gpu.jsonl", heartbeat(code_sha256="")) == []  # no hash reported
    crashed = heartbeat(phase="crashed", code_sha256="a" * 64)
    assert "code_mismatch" not in codes(run("healthy_gpu.jsonl", crashed))


# -- recompiles ---------------------------------------------------------------------------
def test_recompiles_during_training_and_how_much_they_rise() -> None:
    f = only(
        run("healthy_gpu.jsonl", heartbeat(compile={"recompiles": 2, "graphs": 12})), "recompiles"
    )
    assert f.title == "2 recompiles during training"
    assert f.evidence == "2 graphs compiled after warm-up (12 in all)"  # one look: no trend
    live = Live("healthy_gpu.jsonl")
    assert live.found == []
    f = only(live.beat(2, compile={"recompiles": 2}), "recompiles")
    assert f.evidence.endswith(", +2 in the last 2s")
    f = only(live.beat(40, compile={"recompiles": 5, "graphs": 15}), "recompiles")
    assert f.title == "5 recompiles during training"
    assert f.evidence.endswith(", +5 in the last 42s")  # since the 0 seen first


def test_a_recompile_names_its_guard_when_the_trainer_caught_it() -> None:
    why = "forward in /t/model.py:120: tensor 'x' size mismatch at index 1. expected 4096"
    comp = {"recompiles": 1, "graphs": 6, "last_recompile": why}
    f = only(run("healthy_gpu.jsonl", heartbeat(compile=comp)), "recompiles")
    assert f.evidence == f"1 graphs compiled after warm-up (6 in all); last: {why}"
    assert "TORCH_LOGS" not in f.action and "bucket or pad" in f.action


def test_no_recompile_finding_outside_training_or_at_zero() -> None:
    assert run("healthy_gpu.jsonl", heartbeat(compile={"recompiles": 0, "graphs": 12})) == []
    warm = heartbeat(phase="warmup", compile={"recompiles": 3, "graphs": 15})
    assert run("healthy_gpu.jsonl", warm) == []


# -- gil_pressure -------------------------------------------------------------------------
def test_gil_pressure_sustained_over_three_heartbeats() -> None:
    live = Live("healthy_gpu.jsonl")
    high = {"p50_ms": 6.0, "p99_ms": 25.0, "samples": 300}
    assert live.beat(2, gil=high) == []
    assert live.beat(2, gil=high) == []  # the first beat (4 ms) is still in the last three
    f = only(live.beat(2, gil=high), "gil_pressure")
    assert f.title == "GIL pressure: wake-ups 25 ms late"
    assert "p99 25 ms (p50 6.0 ms) in the last 3 heartbeats, over 20 ms" in f.evidence
    assert "busiest: drafter-0 60%, drafter-1 60%, drafter-2 60%" in f.evidence
    assert live.beat(2, gil={**high, "p99_ms": 19.9}) == []


def test_gil_pressure_needs_enough_probe_samples() -> None:
    live = Live("healthy_gpu.jsonl")
    for _ in range(4):
        found = live.beat(2, gil={"p50_ms": 9.0, "p99_ms": 80.0, "samples": 19})
    assert found == []


# -- allocator_retries --------------------------------------------------------------------
def retries(device: str, n: int) -> Any:
    def edit(evs: Events) -> None:
        hb(evs)["memory"][device]["alloc_retries"] = n

    return edit


def test_allocator_retries_rising_since_the_logged_steps() -> None:
    def logged(n: int) -> Any:
        return lambda evs: edit_metrics(
            evs, lambda m: m["memory"]["cuda:5"].update(alloc_retries=n)
        )

    f = only(run("healthy_gpu.jsonl", retries("cuda:5", 12), logged(5)), "alloc_retries")
    assert f.title == "memory fragmentation: allocator retries on cuda:5"
    assert f.evidence.startswith("cuda:5: 12 retries, +7 in the last 1m00s (reserved 79.0 GB")
    assert run("healthy_gpu.jsonl", retries("cuda:5", 12), logged(12)) == []  # not rising


def test_allocator_retries_rising_across_heartbeats() -> None:
    # no per-step memory in metrics.jsonl: the heartbeats diagnose() saw are the history
    no_memory = lambda evs: edit_metrics(evs, lambda m: m.pop("memory"))  # noqa: E731
    live = Live("healthy_gpu.jsonl", no_memory, retries("cuda:6", 3))
    assert live.found == []  # first sight of 3 retries: nothing to say it rises
    memory = copy.deepcopy(hb(live.evs)["memory"])
    memory["cuda:6"]["alloc_retries"] = 4
    f = only(live.beat(2, memory=memory), "alloc_retries")
    assert "cuda:6: 4 retries, +1 in the last 2s" in f.evidence
    # it rose within the 10-minute window: still said a minute later, no more once it is out
    assert "+1 in the last 1m02s" in only(live.beat(60, memory=memory), "alloc_retries").evidence
    assert "alloc_retries" not in codes(live.beat(600, memory=memory))


# -- slow_throughput ----------------------------------------------------------------------
def test_slow_throughput_against_the_baseline() -> None:
    def logged_tok_s(v: float) -> Any:
        return lambda evs: edit_metrics(evs, lambda m: m.update(tok_s=v))

    assert run("healthy_gpu.jsonl", logged_tok_s(19_400), config=BASELINE) == []  # 9.8%
    f = only(run("healthy_gpu.jsonl", logged_tok_s(19_300), config=BASELINE), "slow_throughput")
    assert f.title == "tok/s 10% below the 21.5K baseline"
    assert f.evidence.startswith("19.3K tok/s (median of the last 3 logged steps) vs 21.5K")
    assert run("healthy_gpu.jsonl", logged_tok_s(100)) == []  # no baseline, no opinion
    pct = DiagnosisConfig(baseline_tok_s=21_500, slow_pct=50)
    assert run("step_lines.jsonl", config=pct) == []


def test_slow_throughput_is_quiet_once_the_run_ended() -> None:
    assert "slow_throughput" not in codes(run("killed_held.jsonl", config=BASELINE))


# -- no step line yet ---------------------------------------------------------------------
def test_no_step_line_needs_wandb_lines_and_no_step_line() -> None:
    def drop_log(evs: Events) -> None:
        evs[:] = [e for e in evs if e.get("file") != "train.log"]

    assert "no_step_line" not in codes(run("wandb_only.jsonl", drop_log))

    def a_step_line(evs: Events) -> None:
        evs.append(of_type(events("step_lines.jsonl"), "line")[0])

    assert "no_step_line" not in codes(run("wandb_only.jsonl", a_step_line))


# -- slow_phase: the wait for the target's weights -----------------------------------------
# The trainer walks loading_data -> loading_target -> compiling -> loading_target: the target
# loads on a thread while the drafters compile, and the second loading_target visit is the wait
# for weights not in yet. Earlier runs of this config: the first visit took 0.3 s (it only
# starts the load), the wait 30 s, the whole load 4m30s.
REAL_ORDER = {
    "starting": 4,
    "loading_data": 21,
    "loading_target": 0.3,
    "compiling": 240,
    "loading_target#2": 30,
    "warmup": 31,
    "training": 9000,
    "finished": 0,
}


def waiting_for_weights(wait_s: float, load_s: float, schema: int = 2) -> Any:
    """The current run in its second loading_target visit for `wait_s`, its load begun
    `load_s` ago; earlier runs recorded in the real order, each load 4m30s."""

    def edit(evs: Events) -> None:
        for r in of_type(evs, "runs")[-1]["runs"]:
            if r["phases"].get("compiling", 0) > 200:  # the ones that got past compiling
                r["phases"] = dict(REAL_ORDER)
                r["target_load_s"] = 270.0
        started = NOW - load_s
        data = hb(evs)
        data.update(
            schema=schema,
            phase="loading_target",
            phase_started_at=NOW - wait_s,
            phase_history=[
                {"phase": "starting", "started_at": started - 25},
                {"phase": "loading_data", "started_at": started - 21},
                {"phase": "loading_target", "started_at": started},
                {"phase": "compiling", "started_at": started + 0.3},
                {"phase": "loading_target", "started_at": NOW - wait_s},
            ],
        )
        if schema >= 2:
            data["target_load"] = {"started_at": started, "ended_at": None}

    return edit


def test_waiting_for_weights_is_not_a_slow_first_visit() -> None:
    # 90 s into the wait, 6m15s into a load that took 4m30s before: not twice the usual.
    # The old rule compared the wait with the first visit (0.3 s) and said
    # "loading the target slower than usual | 1m30s so far; 0s last time".
    assert run("slow_compile.jsonl", waiting_for_weights(90, 375)) == []
    evs = events("slow_compile.jsonl")
    waiting_for_weights(90, 375)(evs)
    assert phase_expectation(store(evs)) == "the target load took 4m30s last time"


def test_a_slow_weight_load_is_compared_as_whole_loads() -> None:
    for schema in (2, 1):  # schema 1 has no target_load span: from the first visit
        f = only(run("slow_compile.jsonl", waiting_for_weights(200, 600, schema)), "slow_phase")
        assert f.title == "waiting for the target weights longer than usual"
        assert f.evidence == (
            "the whole load: 10m00s so far; 4m30s last time "
            "(run 20260520-081200-qwen36-27b-0005), median 4m30s over 3 runs"
        )
        # 2 × 4m30s = 9m00s is the bar
        assert run("slow_compile.jsonl", waiting_for_weights(200, 539, schema)) == []


def test_each_visit_is_compared_with_the_same_visit() -> None:
    # The first loading_target visit only starts the load: 0.3 s before, 70 s now is slow
    # (2× and +60 s); compiling is compared with compiling, not with the wait after it.
    def first_visit(since_s: float) -> Any:
        def edit(evs: Events) -> None:
            waiting_for_weights(0, since_s)(evs)
            data = hb(evs)
            data["phase_history"] = data["phase_history"][:3]
            data["phase_started_at"] = NOW - since_s

        return edit

    f = only(run("slow_compile.jsonl", first_visit(70)), "slow_phase")
    assert f.title == "starting the target load slower than usual"
    assert f.evidence.startswith("1m10s so far; 0s last time")
    assert run("slow_compile.jsonl", first_visit(60)) == []


# -- throughput against history: throughput_drop, below_earlier_runs ----------------------
DROP = "recorded/throughput_drop.jsonl"  # rows every 5 steps; 3 s more a drafter step from 50


def test_throughput_drop_needs_every_step_of_the_stretch_below_the_bar() -> None:
    # The fastest recent step (587 at step 85) is 44.7% below the stable median (1063).
    assert codes(run(DROP, config=DiagnosisConfig(drop_pct=44))) == ["throughput_drop"]
    assert "throughput_drop" not in codes(run(DROP, config=DiagnosisConfig(drop_pct=45)))

    def last_step_as_before(evs: Events) -> None:
        e, m = metrics_records(evs)[-1]
        assert m["step"] == 85
        e["text"] = json.dumps({**m, "tok_s": 1062.0})

    # One step back at the old rate: not sustained (yet) — and not below the earlier run.
    found = codes(run(DROP, last_step_as_before))
    assert "throughput_drop" not in found and "below_earlier_runs" not in found


def test_a_drop_longer_than_the_fast_part_stays_a_drop() -> None:
    """Only 4 fast rows after the warm-up (skip 6) and 7 slow: a median over all rows before
    the recent 2 is a slow one, and the drop would have become the run's normal."""
    cfg = DiagnosisConfig(drop_skip_rows=6, drop_rows=2, drop_min_stable=3)
    f = only(run(DROP, config=cfg), "throughput_drop")
    assert f.evidence == (
        "576 tok/s (median of the last 2 logged steps) vs 1.1K (median of the 4 logged steps"
        " before); every logged step since step 55 more than 30% below"
    )


def test_below_earlier_runs_speaks_when_the_run_did_not_drop_against_itself() -> None:
    """One cause, one finding: with throughput_drop's bar above this drop, the comparison
    with the earlier run (1.3K at best) speaks instead."""
    (f,) = run(DROP, config=DiagnosisConfig(drop_pct=45))
    assert (f.code, f.title) == (
        "below_earlier_runs",
        "tok/s 60% below earlier run 20261202-130900-tiny-cpu-06f5",
    )
    assert f.evidence.startswith("521 tok/s (median of the last 5 logged steps, the fastest 587)")


def test_a_baseline_overrides_both_history_rules() -> None:
    found = run(DROP, config=DiagnosisConfig(baseline_tok_s=1_000))
    assert codes(found) == ["slow_throughput"]
    assert found[0].evidence.startswith("521 tok/s (median of the last 5 logged steps) vs 1.0K")


def padding(share: float, packing: bool) -> Any:
    def edit(evs: Events) -> None:
        hb(evs)["data"].update(padding=share, packing=packing)

    return edit


def test_mostly_padding_from_the_heartbeats_padding_share() -> None:
    """A recorded run with packing (2.5 % padding) made to pad `padding_frac` or more: the
    advice is packing when it is off, a smaller bucket or more data when it is on."""
    name = "recorded/healthy_training.jsonl"
    assert run(name) == []
    f = only(run(name, padding(0.9, False)), "mostly_padding")
    assert (f.severity, f.title) == ("warning", "90% of every batch is padding")
    assert "packing is off" in f.evidence and "data.packing = true" in f.action
    f = only(run(name, padding(0.6, True)), "mostly_padding")
    assert "packing is on" in f.evidence and "data.seq_buckets" in f.action
    assert run(name, padding(0.49, False)) == []  # under padding_frac (0.5)
