"""Diagnosis on scenarios recorded from real CPU runs (scripts/record-scenarios): each fault
injected for real with DFLASH_FAULT, the run driven through deploy and launch, and what the
agent sent a freshly connected monitor kept as it was (times shifted, identities renamed:
tests/infra/record_scenarios.py). Every scenario with the finding it must give, at the
default thresholds; the healthy one must stay quiet."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from test_diagnosis import NOW, SCENARIOS, Events, codes, events, hb, only, run, store

from dflash_tui import evaluation
from dflash_tui.diagnosis import DEFAULT_CONFIG, diagnose, possible
from dflash_tui.facts import phase_expectation
from dflash_tui.stages import busiest, of_heartbeat
from dflash_tui.throughput_history import earlier_best
from trainer.contract.heartbeat import Heartbeat
from trainer.contract.phases import LOADING_TARGET, TARGET_WAIT, phase_spans
from trainer.contract.typed import decode

RECORDED = SCENARIOS / "recorded"


def rec(name: str) -> str:
    return f"recorded/{name}.jsonl"


def test_every_recorded_scenario_has_a_test_and_says_how_it_was_made():
    names = sorted(p.stem for p in RECORDED.glob("*.jsonl"))
    assert len(names) == 31
    for name in names:
        head = [ln for ln in (RECORDED / f"{name}.jsonl").read_text().splitlines()[:4]]
        assert head[0].startswith(f"# {name}: ") and "scripts/record-scenarios" in head[1]
        assert f"test_{name}" in globals(), name


def test_healthy():
    assert run(rec("healthy")) == []
    s = store(events(rec("healthy")))
    assert s.heartbeat is not None and s.heartbeat.phase == "training"
    assert s.outcome() is None and len(s.metrics) >= 5


def test_stage_times():
    """A trainer that times its stages: every pipeline thread has them, in the heartbeat and
    in metrics.jsonl. On two shared cores the drafters limit (their work fills their step)
    and the targets wait ~20 % of their loop on q_hs: under the line, and no GPU idles."""
    assert run(rec("stage_times")) == []
    s = store(events(rec("stage_times")))
    rows = of_heartbeat(s.heartbeat)
    assert [r.name for r in rows] == [
        "prefetch-0", "prefetch-1", "target-0", "target-1", "drafter-0", "drafter-1",
    ]  # fmt: skip
    target = rows[2]
    assert [st.name for st in target.stages] == [
        "wait q_pre", "forward", "transfer", "mask", "wait q_hs",
    ]  # fmt: skip
    assert 0.1 < target.share("wait q_hs") < 0.4
    assert busiest(rows).role == "drafter"
    assert set(s.metrics[-1].stages_ms) == {r.name for r in rows}


def test_fingerprinted():
    """Two runs whose config.json carries the environment and the preflight: the same
    environment and a CPU run's torch path give no finding, though the second run was 15%
    slower. Recorded on 2 shared cores, its GIL probe woke late while no pipeline thread used
    more than 12 % of a core: a CPU shortage, not GIL pressure (test_diagnosis_host.py).
    Variations: test_environment.py."""
    assert run(rec("fingerprinted")) == []


def test_host_context():
    """The agent's host sample and the run's checkpoints, as recorded on the shared 2-core
    machine: oversubscribed (info), its GIL probe late because of it (gil_pressure quiet),
    disk and memory plenty. The rules' variations: test_diagnosis_host.py."""
    found = run(rec("host_context"))
    assert codes(found) == ["host_oversubscribed"]
    s = store(events(rec("host_context")))
    h = s.host
    assert h is not None and h.cpus == 2 and len(h.load) == 3 and h.load[0] / h.cpus > 1.5
    assert h.disk is not None and h.disk.path == "/workspace/dflash/runs"
    assert h.mem_total and h.mem_available and h.disk.free > 1 << 30
    info = s.current_run()
    assert info is not None and info.checkpoints is not None
    use = info.checkpoints
    assert (use.count, use.newest_step, use.every) == (2, 40, 20) and use.newest_bytes > 0
    assert s.heartbeat is not None and use.count_to_come(s.heartbeat.total_steps) == 98


def test_held_out_eval():
    """The eval thread of a real run: τ against the chat-trained tiny target rises as the
    drafter trains, the earlier comparable run's best is the one to beat, and each run's
    eval is in the runs list. Recorded on 2 shared cores, the eval (at the lowest CPU
    priority) outlasted its 10-step interval: skipped evals are said, at info level."""
    assert codes(run(rec("held_out_eval"))) == ["eval_skipped"]
    s = store(events(rec("held_out_eval")))
    tau = evaluation.of_store(s)
    assert tau is not None and tau.latest is not None and tau.earlier is not None
    taus = [p.tau for p in tau.info.history if p.tau is not None]
    assert len(taus) >= 3 and taus[-1] > taus[0] >= 1.0
    assert tau.trend == "up" and tau.best == tau.latest
    earlier, followed = s.runs[0], s.runs[-1]
    assert earlier.eval is not None and tau.earlier.run_id == earlier.run_id
    assert tau.earlier.point == earlier.eval.best
    assert followed.eval is not None and followed.eval.data == "builtin:tiny-chat-answers"
    assert tau.info.skipped > 0 and "skipped" in tau.state()


def test_crashed_in_thread():
    (f,) = run(rec("crashed_in_thread"))
    assert (f.code, f.title) == ("crashed", "run crashed in drafter-0 (exit code 1)")
    assert f.evidence == "InjectedFault: injected fault in drafter at item 15 (DFLASH_FAULT)"
    outcome = store(events(rec("crashed_in_thread"))).outcome()
    assert outcome is not None and (outcome.kind, outcome.thread) == ("crashed", "drafter-0")


def test_died_before_start():
    found = run(rec("died_before_start"))
    assert codes(found) == ["died_at_start"]  # one alert: crashed stands aside
    assert found[0].evidence.startswith("error: train.lr: expected a number, got 'abc'")
    s = store(events(rec("died_before_start")))
    assert s.heartbeat is None  # it never wrote one
    (info,) = s.runs  # a run dir with launch files only is a run
    assert info.outcome is not None and info.outcome.kind == "died_before_start"
    assert info.outcome.summary == (
        "died before start (exit code 2): error: train.lr: expected a number, got 'abc'"
    )


def test_killed_sigkill():
    found = run(rec("killed_sigkill"))
    assert codes(found) == ["killed", "stale_heartbeat"]
    assert found[0].title == "run killed by SIGKILL"
    assert found[0].evidence.startswith("no error recorded; last heartbeat: phase training, step ")
    # The wrapper read the trainer's memory cgroup as it died (a cgroup v1 one here) and
    # the kernel log: no OOM kill. The self-sent SIGKILL is "something else".
    assert found[0].evidence.endswith(
        "; no OOM kill recorded in memory.oom_control of /sys/fs/cgroup/memory/process_api/"
        "1e7886f65a28bb7320e07a37a6c84888, the kernel log names no OOM kill of the trainer: "
        "something else sent SIGKILL"
    )
    assert found[0].action.startswith("find who sent SIGKILL")
    assert "dump stacks" not in found[1].action
    assert found[1].title == "process dead"
    assert found[1].action.startswith("the process is gone")  # no dump-stacks advice
    outcome = store(events(rec("killed_sigkill"))).outcome()
    assert outcome is not None and outcome.kind == "killed" and outcome.signal == "SIGKILL"


def test_stalled_loop():
    # The hang is inside the drafters and the targets back up behind them (q_hs full for
    # 2m09s), but no step for that long is no throughput to tune: no "add drafter replicas".
    (f,) = run(rec("stalled_loop"))
    assert (f.code, f.title) == (
        "loop_stalled",
        "training loop stalled in drafter-0 (forward for 2m09s)",
    )
    assert f.evidence == "heartbeat fresh, but no step for 2m09s (step 30)"
    assert f.action == "dump stacks (d) to see where it waits"
    s = store(events(rec("stalled_loop")))
    assert [t.state for t in s.heartbeat.threads_of("target")] == ["waiting: q_hs full"] * 2
    assert not possible(s, NOW, DEFAULT_CONFIG).tune


def test_stalled_loop_of_a_dead_process_says_no_dump_stacks():
    """The stall recorded above, then the process dies within the heartbeat's freshness (6 s):
    edited in are the agent's liveness and runs-list events of killed_sigkill's real SIGKILL
    exit, renamed to this run. Stacks cannot be dumped from a dead process: no loop_stalled."""
    evs = events(rec("stalled_loop"))
    run_id = next(e["run_id"] for e in evs if e["type"] == "follow")
    dead = [
        {**e, "run_id": run_id, "exit": {**e["exit"], "run_id": run_id}}
        for e in events(rec("killed_sigkill"))
        if e["type"] == "liveness"
    ]
    s = store(evs + dead)
    found = diagnose(s, NOW)
    assert codes(found) == ["killed"]
    assert not any("dump stacks" in f.action for f in found)
    assert not possible(s, NOW, DEFAULT_CONFIG).signal


def test_compiling_during_training_gives_no_bottleneck_advice():
    """drafters_bottleneck's (and fingerprinted's) recording with one documented edit: its
    heartbeat says a graph is compiling now (CompileInfo.current, as dynamo's hooks set it
    for a recompile after warm-up). The targets wait on a compile then, not on slow
    drafters: no "add replicas"."""
    evs = events(rec("drafters_bottleneck"))
    assert codes(diagnose(store(evs), NOW)) == ["drafters_bottleneck"]
    for e in evs:
        if e["type"] == "heartbeat":
            e["data"]["compile"].update(current="drafter forward", current_since=NOW - 40)
    s = store(evs)
    assert diagnose(s, NOW) == []
    assert not possible(s, NOW, DEFAULT_CONFIG).tune
    # fingerprinted's GIL lateness (threads at 5-17 % of a core: gil_pressure's false alarm,
    # test_fingerprinted) stays quiet with the same edit too.
    evs = events(rec("fingerprinted"))
    for e in evs:
        if e["type"] == "heartbeat":
            e["data"]["compile"].update(current="drafter forward", current_since=NOW - 40)
    assert diagnose(store(evs), NOW) == []


def test_buffered_bursts():
    """A real block-buffered train.log, read as `status` reads it: the whole tail in one go,
    so the last step line was *read* 3 s ago (the old rule timed from that and said nothing)
    though it names step 470 and the heartbeat is at 533; metrics.jsonl says when step 480's
    line was due."""
    evs = events(rec("buffered_bursts"))
    s = store(evs)
    assert s.heartbeat is not None and s.last_step_line_at is not None
    assert s.remote_now(NOW) - s.last_step_line_at < DEFAULT_CONFIG.buffered_s
    (f,) = run(rec("buffered_bursts"))
    assert (f.code, f.severity) == ("output_buffered", "warning")
    assert f.evidence == (
        "heartbeat at step 533, train.log's last step line is step 470; step 480's line was "
        "due 1m18s ago (metrics.jsonl has it)"
    )
    assert "PYTHONUNBUFFERED" in f.action


def test_one_replica_hung():
    """One replica hung: the threads waiting on it have been in their wait as long (prefetch-0
    waited on a full q_pre 130.5 s, as long as drafter-1's forward), so the longest state
    alone named a waiter; the one at work is the one stuck."""
    found = run(rec("one_replica_hung"))
    assert found[0].code == "loop_stalled" and found[0].severity == "critical"
    assert found[0].title == "training loop stalled in drafter-1 (forward for 2m10s)"
    hb = store(events(rec("one_replica_hung"))).heartbeat
    assert hb is not None
    waits = {t.name: hb.in_state_s(t) for t in hb.threads if t.state.startswith("waiting")}
    assert waits["drafter-0"] > 120 and max(waits.values()) >= 130


def test_prefetch_bottleneck():
    # The fault sleeps in batch building, as a thread blocked on a slow disk does: 0 % CPU.
    # More prefetch threads would only wait too: the advice is the data source, not threads.
    (f,) = run(rec("prefetch_bottleneck"))
    assert (f.code, f.title) == ("prefetch_bottleneck", "data prefetch is the bottleneck")
    assert f.evidence.startswith("q_pre 0/8 0/8")
    assert "target-0, target-1 waiting: q_pre empty for" in f.evidence
    assert "prefetch-0 'building batch' 0% CPU" in f.evidence
    assert f.evidence.endswith("; prefetch threads 0% CPU on average over 10 heartbeats")
    assert "add prefetch threads" not in f.action
    assert f.action.startswith("prefetch waits, it does not compute (under 50% CPU)")
    assert "disk" in f.action


def test_prefetch_bottleneck_cpu_bound():
    """The same recording with its prefetch threads' cpu_pct edited to 95 % in the heartbeat
    and every telemetry.jsonl line (documented: threads that compute their batches): then
    more prefetch threads are the advice."""

    def cpu_bound(beat: dict) -> dict:
        for th in beat["threads"]:
            if th["role"] == "prefetch":
                th["cpu_pct"] = 95.0
        return beat

    evs = events(rec("prefetch_bottleneck"))
    for e in evs:
        if e["type"] == "heartbeat":
            cpu_bound(e["data"])
        elif e["type"] == "line" and e["file"] == "telemetry.jsonl":
            e["text"] = json.dumps(cpu_bound(json.loads(e["text"])))
    (f,) = diagnose(store(evs), NOW)
    assert f.code == "prefetch_bottleneck"
    assert f.evidence.endswith("; prefetch threads 95% CPU on average over 10 heartbeats")
    assert f.action.startswith("add prefetch threads")


def test_targets_bottleneck():
    (f,) = run(rec("targets_bottleneck"))
    assert (f.code, f.title) == ("targets_bottleneck", "targets are the bottleneck")
    assert f.evidence.startswith("drafter-0, drafter-1 waiting: q_hs empty for")
    assert "q_hs 0/8 0/8" in f.evidence and "q_pre 8/8 8/8" in f.evidence


def test_drafters_bottleneck():
    (f,) = run(rec("drafters_bottleneck"))
    assert (f.code, f.title) == ("drafters_bottleneck", "drafters are the bottleneck")
    assert f.evidence.startswith("target-0, target-1 waiting: q_hs full for")
    assert "q_hs 4/8 4/8" in f.evidence


def test_thread_straggler():
    """target-1 slowed by 1.5 s a batch under fixed routing: it is named, and the waits it
    causes are the evidence (drafter-1 on q_hs for its batches, target-0 on a full q_hs
    behind drafter-0 held at the barrier). drafter-0, whose compute on these shared cores
    came out 2x drafter-1's, is not: what the others wait for is not it. The host was
    loaded by other jobs while it was recorded (the host findings say so)."""
    found = run(rec("thread_straggler"))
    assert codes(found) == ["thread_straggler", "host_memory_short", "host_oversubscribed"]
    f = found[0]
    assert f.title == "target-1 is a straggler on cpu"
    assert f.evidence.startswith("2.7 s of compute per loop vs 1.3 s, its target peer's (2.0x)")
    assert "the others wait: drafter-1 65%, target-0 47% of their loops; routing fixed" in (
        f.evidence
    )
    assert f.action.startswith('runtime.routing = "shared" lets the other threads take')
    # Above the recorded factor, or with fewer of the others waiting, it is quiet.
    for strict in (
        replace(DEFAULT_CONFIG, straggler_factor=2.1),
        replace(DEFAULT_CONFIG, rank_wait_frac=0.66),
        replace(DEFAULT_CONFIG, rank_min_steps=10_000),
    ):
        assert "thread_straggler" not in codes(diagnose(store(events(rec("thread_straggler"))),
                                                        NOW, strict))  # fmt: skip


def test_shared_routing():
    """The same slowed target under runtime.routing = "shared": one q_pre and one q_hs in the
    heartbeat, target-0 takes what target-1 cannot, and no thread waits on it, so nothing
    is a straggler and no pipeline rule speaks (the host was loaded by other jobs)."""
    found = run(rec("shared_routing"))
    assert codes(found) == ["host_oversubscribed"]
    hb = store(events(rec("shared_routing"))).heartbeat
    assert hb is not None and hb.queues.routing == "shared" and hb.queues.shared
    assert [q.capacity for q in hb.queues.q_pre] == [16]
    assert [q.capacity for q in hb.queues.q_hs] == [16]
    rows = {r.name: r for r in of_heartbeat(hb)}
    assert rows["target-1"].ms("forward") > 2 * rows["target-0"].ms("forward")
    assert rows["drafter-0"].share("wait q_hs") < 0.1 and rows["drafter-1"].share("wait q_hs") < 0.1


def test_bottlenecks_need_the_starved_side_blocked_for_long():
    # The recordings caught every thread of the starved role blocked >= 32 s; at a bar above
    # that the rule is quiet: a wait between two batches is normal.
    strict = replace(DEFAULT_CONFIG, starved_s=60.0)
    for name in ("prefetch_bottleneck", "targets_bottleneck", "drafters_bottleneck"):
        assert diagnose(store(events(rec(name))), NOW, strict) == [], name


def test_nan_loss():
    (f,) = run(rec("nan_loss"))
    assert (f.code, f.severity, f.title) == (
        "loss_not_finite",
        "critical",
        "loss is nan from step 50 on",
    )
    assert f.evidence == (
        "loss nan at step 100, non-finite in 6 logged steps; last finite 4.7559 at step 40"
    )
    assert f.action.startswith("kill it (K)") and "at or before step 40" in f.action


HEALTH = ("loss_diverging", "not_learning", "grad_norm_spike")


def test_healthy_training():
    """A normal run past the training-health rules' warm-up, every row with its grad norm:
    none of them speaks, and nothing else does either (recorded on 2 shared cores at load
    ~20: its GIL probe woke late, with pipeline threads under half a core: gil_pressure quiet)."""
    found = run(rec("healthy_training"))
    assert codes(found) == []
    rows = store(events(rec("healthy_training"))).metrics
    assert (
        rows[-1].step == 250
        and sum(m.step > DEFAULT_CONFIG.health_warmup_steps for m in rows) == 15
    )
    assert all(m.grad_norm is not None and 0 < m.grad_norm < 50 for m in rows)


def test_loss_diverging():
    """lr × 1000 from step 130 (the optimizer's, as logged): the loss jumps to 9.1 and settles
    near 6, about twice its best."""
    found = run(rec("loss_diverging"))
    assert [c for c in codes(found) if c != "gil_pressure"] == ["loss_diverging"]
    f = found[0]
    assert (f.code, f.severity) == ("loss_diverging", "warning")
    assert f.title == "loss diverging: 1.9× its best since step 140"
    assert f.evidence == (
        "median loss 5.9964 over steps 180–200 (3 logged), 1.93× the best 3.1145 at step 110; "
        "first above 1.5× at step 140 (9.1436, lr 2.98)"
    )
    assert "at or before step 110" in f.action


def test_not_learning():
    """lr 0 from the first step (the optimizer's, as logged): the drafter keeps its init."""
    found = run(rec("not_learning"))
    assert [c for c in codes(found) if c != "gil_pressure"] == ["not_learning"]
    f = found[0]
    assert (f.code, f.severity) == ("not_learning", "critical")
    assert f.title == "not learning: acc ~0 for 60 steps"
    assert f.evidence == (
        "acc <= 0.000 and streak <= 1.00 in every logged step from 110 to 170 (7 rows); "
        "loss 20.4483 → 20.4628 (+0.1 %); lr 0"
    )
    assert f.action.startswith("kill it (K)") and "train.lr" in f.action


def test_grad_norm_spike():
    """The loss scaled by 100 before the backward at steps 131, 161, 191 (1-based): those
    rows' norms are ~70-95× the others'; the loss itself trains on (grad_clip bounds the
    update)."""
    found = run(rec("grad_norm_spike"))
    assert [c for c in codes(found) if c != "gil_pressure"] == ["grad_norm_spike"]
    f = found[0]
    assert (f.code, f.severity) == ("grad_norm_spike", "warning")
    assert f.title == "gradient norm spikes in 3 of the last 10 logged rows"
    assert f.evidence == (
        "grad norm 135.8 in steps 191–200, 94× the running median 1.438; above 10× it in "
        "steps 131–140, 161–170, 191–200"
    )


def test_stalled_checkpoint():
    (f,) = run(rec("stalled_checkpoint"))
    assert (f.code, f.title) == (
        "checkpoint_stalled",
        "checkpoint after step 20 stalled in drafter-0 (checkpoint for 2m09s)",
    )
    assert "disk" in f.action
    assert "usually takes" not in f.evidence  # its first save: nothing to compare with


def earlier_save(seconds: float) -> Any:
    """Documented edit: the run saved once before, taking `seconds` (a checkpointing visit
    and the training visit after it, inserted before the save under way)."""

    def edit(evs: Events) -> None:
        data = hb(evs)
        current = data["phase_history"][-1]
        start = current["started_at"] - 60 - seconds
        data["phase_history"][-1:-1] = [
            {"phase": "checkpointing", "started_at": start, "visit": 1},
            {"phase": "training", "started_at": start + seconds, "visit": 2},
        ]
        current["visit"] = 2

    return edit


def test_stalled_checkpoint_against_the_runs_own_saves():
    """A run whose saves take minutes is not stalled at 2 minutes: its own earlier save
    sets the bar (2 × 100 s + 60 s); one of 20 s leaves the fixed 120 s."""
    assert "checkpoint_stalled" not in codes(run(rec("stalled_checkpoint"), earlier_save(100)))
    f = only(run(rec("stalled_checkpoint"), earlier_save(20)), "checkpoint_stalled")
    assert "a save usually takes 20s (median of this run's 1 earlier saves)" in f.evidence


def test_target_wait_as_usual():
    """The false alarm, on a real run: the weights take as long as in the earlier run, so
    waiting 60 s for them is normal. The old monitor compared this wait with the earlier
    run's first loading_target visit (a second) and warned."""
    evs = events(rec("target_wait_as_usual"))
    s = store(evs)
    hb = s.heartbeat
    assert hb is not None and hb.visit == TARGET_WAIT
    wait = NOW - hb.phase_started_at
    (earlier,) = [r for r in s.runs if r.run_id != s.run_id]
    first_visit = earlier.phases[LOADING_TARGET]
    # What the old rule saw: more than 2× and 60 s more than "last time".
    assert wait > 2 * first_visit and wait - first_visit > 60
    assert diagnose(s, NOW) == []
    assert earlier.target_load_s is not None and earlier.target_load_s > 80
    assert phase_expectation(s, NOW) == "the target load took 1m20s last time"
    # Every visit of the earlier run, the wait included, is in its phase durations.
    assert {"loading_target", "compiling", "loading_target#2", "warmup"} <= set(earlier.phases)
    assert earlier.phases["loading_target#2"] > 60


def test_target_load_slower():
    (f,) = run(rec("target_load_slower"))
    assert (f.code, f.title) == ("slow_phase", "waiting for the target weights longer than usual")
    assert f.evidence.startswith("the whole load: 1m16s so far; 4s last time (run ")


def test_slow_compile():
    s = store(events(rec("slow_compile")))
    assert phase_expectation(s, NOW) == "compile took 1s last time"
    (f,) = diagnose(s, NOW)
    assert (f.code, f.title) == ("slow_phase", "compiling slower than usual")
    assert f.evidence.startswith("1m09s so far; 1s last time (run ")
    assert f.evidence.endswith("; 1/3 buckets")


# -- throughput against history (dflash_tui/throughput_history.py) -------------------------
THROUGHPUT = ("throughput_drop", "below_earlier_runs")


def test_throughput_drop():
    """slow_from:50:drafter:3: the drafter steps after step 50 take 3 s longer. The run's own
    steps 20-50 (after the 3 warm-up rows) are the baseline; every row since step 55 is
    slower. The earlier run's best (1.3K) is beaten too, but one cause is one finding."""
    (f,) = run(rec("throughput_drop"))
    assert (f.code, f.severity) == ("throughput_drop", "warning")
    assert f.title == "tok/s down 51% from this run's own baseline"
    assert f.evidence == (
        "521 tok/s (median of the last 5 logged steps) vs 1.1K (median of the 7 logged steps"
        " before); every logged step since step 55 more than 30% below"
    )
    assert f.action.endswith("with before step 55")


def test_below_earlier_runs():
    """slow:drafter:3 from the start: ~500 tok/s all along (no drop against itself), the two
    earlier runs of the same config logged 1.6K and 1.7K at best: the faster is named."""
    (f,) = run(rec("below_earlier_runs"))
    assert (f.code, f.severity) == ("below_earlier_runs", "warning")
    s = store(events(rec("below_earlier_runs")))
    first, second, followed = s.runs
    assert followed.run_id == s.run_id
    assert first.best_tok_s is not None and second.best_tok_s is not None
    assert round(first.best_tok_s) == 1553 and round(second.best_tok_s) == 1710
    assert f.title == f"tok/s 71% below earlier run {second.run_id}"
    assert f.evidence == (
        f"503 tok/s (median of the last 5 logged steps, the fastest 530) vs 1.7K, the best of"
        f" run {second.run_id} (same shape and layout); every one more than 40% below"
    )
    assert f.action.endswith(f"stage times with run {second.run_id}")


def test_smaller_batch():
    """A real run with `--set train.batch_size=2` after one of the default 4: another shape,
    so no earlier run to compare with. Its own tok/s, noisy on 2 shared cores (952 to 2.0K
    over 22 rows as the load around it changed), is no drop. Its GIL lateness came with
    pipeline threads under half a core: the host's load, not the GIL (gil_pressure quiet)."""
    assert codes(run(rec("smaller_batch"))) == []
    s = store(events(rec("smaller_batch")))
    earlier, followed = s.runs
    assert earlier.signature is not None and followed.signature is not None
    assert "train.batch_size=4" in earlier.signature.shape.split()
    assert "train.batch_size=2" in followed.signature.shape.split()
    assert earlier_best(s) is None
    # The same runs with the earlier one given this run's shape: then it is the one compared.
    s.runs[0] = replace(earlier, signature=followed.signature)
    best = earlier_best(s)
    assert best is not None and (best.run_id, round(best.tok_s)) == (earlier.run_id, 1735)


def test_below_earlier_runs_compares_only_runs_of_the_same_shape():
    """Edit, the only one: the two earlier runs of below_earlier_runs given another batch
    (train.batch_size=2 in their signatures, as smaller_batch's run has). The same slow run
    then has nothing to be compared with."""

    def other_batch(evs):
        (followed,) = {e["run_id"] for e in evs if e["type"] == "follow"}
        earlier = [r for e in evs if e["type"] == "runs" for r in e["runs"]]
        earlier = [r for r in earlier if r["run_id"] != followed]
        assert len(earlier) == 2
        for r in earlier:
            r["signature"]["shape"] = r["signature"]["shape"].replace(
                "train.batch_size=4", "train.batch_size=2"
            )

    assert "below_earlier_runs" in codes(run(rec("below_earlier_runs")))
    assert run(rec("below_earlier_runs"), other_batch) == []


def test_throughput_is_quiet_on_every_healthy_recording_as_its_rows_arrived():
    """The healthy recordings, the rows of each as a monitor had them one after another (the
    CPU ones are noisy: 2 shared cores, tok/s within a run varies 2x): neither rule speaks."""
    for name in ("healthy", "stage_times", "fingerprinted", "held_out_eval", "smaller_batch"):
        evs = events(rec(name))
        rows = [e for e in evs if e["type"] == "line" and e["file"] == "metrics.jsonl"]
        for n in range(len(rows) + 1):
            later = {id(e) for e in rows[n:]}
            cut = [e for e in evs if id(e) not in later]
            found = codes(diagnose(store(cut), NOW))
            assert not set(THROUGHPUT) & set(found), (name, n, found)


# -- the same scenarios on an H200 (bench/gpu_contract.sh): real NVML samples ----------------
def test_healthy_h200():
    """The tiny GPU config keeps the H200 at ~8 %: a busy target on an idle GPU is not stuck."""
    assert run(rec("healthy_h200")) == []
    s = store(events(rec("healthy_h200")))
    assert s.gpu is not None and s.gpu.backend == "nvml"
    (gpu,) = s.gpu.devices
    assert gpu.name == "NVIDIA H200" and gpu.util is not None and gpu.util < 20
    assert s.heartbeat is not None and s.heartbeat.devices["cuda:0"].uuid == gpu.uuid
    assert s.gpu_roles() == {0: "drafter+target"}
    assert any(p.mem_used > 0 for p in gpu.processes)


def test_crashed_in_thread_h200():
    # It died at step 15 with no step line yet (one every 50 steps): not "before its first step".
    (f,) = run(rec("crashed_in_thread_h200"))
    assert (f.code, f.title) == ("crashed", "run crashed in drafter-0 (exit code 1)")


def test_killed_sigkill_h200():
    # The driver freed the GPU memory of the killed process: nothing held.
    assert codes(run(rec("killed_sigkill_h200"))) == ["killed", "stale_heartbeat"]


@pytest.mark.parametrize("name", sorted(p.stem for p in RECORDED.glob("*.jsonl")))
def test_recorded_heartbeats_walk_the_contracts_phase_order(name):
    """The recorded heartbeats' phase_history, in the order the real trainer walks."""
    order = ["starting", "loading_data", "loading_target", "compiling", "loading_target#2",
             "warmup", "training"]  # fmt: skip
    beats = [e["data"] for e in events(rec(name)) if e["type"] == "heartbeat"]
    beats += [
        json.loads(e["text"])
        for e in events(rec(name))
        if e["type"] == "line" and e["file"] == "telemetry.jsonl"
    ]
    for data in beats:
        keys = [v.key for v in phase_spans(decode(Heartbeat, data).phase_history)]
        start = [k for k in keys if k in order]
        assert start == sorted(start, key=order.index), (name, keys)
