"""Every phase of a real CPU run, and how long each took: the contract's phase order is the
one the trainer walks, and every visit's duration adds up (the wait for the target's weights
included), as read back through the contract's own readers."""

from __future__ import annotations

import itertools

import pytest

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.phases import TARGET_WAIT, phase_durations, phase_spans
from trainer.contract.telemetry import read_telemetry

# The target's weights take 8 s longer to load, so they are not in when the drafters have
# compiled, and tokenising takes 1 s longer: both real sleeps in the real threads
# (DFLASH_FAULT). The phase order depends on the load outlasting compiling: beside another
# test's trainer on two cores, compiling once took longer than a 4 s load (CI), so the test
# runs alone, with twice that margin.
SLOW = {"DFLASH_FAULT": "slow:load_target:8,slow:data:1"}


@pytest.mark.serial  # a race between two real threads' durations: not beside another trainer
def test_every_phase_and_its_duration_from_a_real_run(start_trainer):
    p = start_trainer("--max-steps", "6", "--set", "train.log_every=2", env=SLOW)
    assert p.wait(timeout=120) == 0
    hb = read_heartbeat(p.run_dir / "heartbeat.json")
    assert isinstance(hb, Heartbeat), hb

    spans = phase_spans(hb.phase_history, final=True)
    assert [s.key for s in spans] == [
        "starting",
        "loading_data",
        "loading_target",
        "compiling",
        "loading_target#2",  # compiled before the weights were in: the wait
        "warmup",
        "training",
        "stopping",
        "checkpointing",
        "finished",
    ]
    # Each visit ends where the next begins, and together they cover the whole run.
    for a, b in itertools.pairwise(spans):
        assert a.ended_at == b.started_at
    took = phase_durations(hb.phase_history, hb.now, final=True)
    assert sum(took.values()) == pytest.approx(spans[-1].started_at - hb.started_at)

    assert took["loading_data"] >= 1.0  # the injected second
    # The load began in the first loading_target visit and ended inside the wait.
    load = hb.target_load
    assert load is not None and load.ended_at is not None
    first, wait = spans[2], spans[4]
    assert first.started_at <= load.started_at <= first.started_at + took["loading_target"]
    assert wait.started_at <= load.ended_at <= wait.started_at + took[TARGET_WAIT] + 0.5
    load_s = hb.target_load_s()
    assert load_s is not None and load_s >= 8.0
    # The wait is the part of the load that compiling did not hide.
    assert took[TARGET_WAIT] == pytest.approx(load.ended_at - wait.started_at, abs=0.5)
    assert took[TARGET_WAIT] < load_s

    # The history in telemetry.jsonl ends with the final heartbeat.
    beats, skipped = read_telemetry(p.run_dir / "telemetry.jsonl")
    assert skipped == 0 and beats and beats[-1].now == hb.now and beats[-1].phase == "finished"
    assert [b.now for b in beats] == sorted(b.now for b in beats)
