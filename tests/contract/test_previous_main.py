"""Run dirs written by the previous main's trainer and agent (schema 1, commit c119aa7,
recorded through dflash-tui: tests/fixtures/rundirs/main-c119aa7/README.md) read by this
contract, with exact values; and a heartbeat from a newer trainer read by this one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.contract.comparable import comparable, signature_of
from trainer.contract.heartbeat import (
    DeviceMemory,
    Heartbeat,
    QueueDepth,
    Queues,
    parse_heartbeat,
    read_heartbeat,
    upgrade_note,
)
from trainer.contract.outcomes import outcome_of
from trainer.contract.phases import phase_durations
from trainer.contract.records import ExitRecord, read_config, read_exit, read_launch
from trainer.contract.typed import Unreadable

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED = OLD / "20261201-031405-tiny-cpu-6e92"
STOPPED = OLD / "20261201-031436-tiny-cpu-b507"
CRASHED = OLD / "20261201-031510-tiny-cpu-ca8a"
DIED = OLD / "20261201-031600-tiny-cpu-32b0"


def hb_of(run_dir: Path) -> Heartbeat:
    hb = read_heartbeat(run_dir / "heartbeat.json")
    assert isinstance(hb, Heartbeat), hb
    return hb


def test_a_schema_1_heartbeat_reads_field_by_field():
    hb = hb_of(FINISHED)
    assert (hb.schema, hb.run_id, hb.phase, hb.step, hb.total_steps) == (
        1,
        "20261201-031405-tiny-cpu-6e92",
        "finished",
        40,
        40,
    )
    assert (hb.pid, hb.process_group, hb.host, hb.now) == (4558, 4558, "vm", 1796094858.544029)
    assert hb.code_sha256.startswith("e99a1a3940e5")
    assert [t.name for t in hb.threads] == [
        "MainThread", "gil-probe", "heartbeat", "prefetch-0", "prefetch-1",
        "target-0", "target-1", "drafter-0", "drafter-1",
    ]  # fmt: skip
    assert hb.queues == Queues(q_pre=[QueueDepth(0, 8)] * 2, q_hs=[QueueDepth(0, 8)] * 2)
    assert hb.memory == {"cpu": DeviceMemory(587460608, 587460608, 587460608, 0)}
    assert hb.devices["cpu"].name == "cpu" and hb.devices["cpu"].uuid is None
    assert hb.error is None and hb.exit_code == 0
    assert hb.target_load is None and hb.last_checkpoint is None and hb.proc_start is None
    assert not hb.newer_schema and upgrade_note(hb) is None


def test_schema_1_phase_durations_count_every_visit():
    hb = hb_of(FINISHED)
    took = phase_durations(hb.phase_history, hb.now, final=True)
    assert list(took) == [
        "starting", "loading_data", "loading_target", "compiling", "warmup", "training",
        "checkpointing", "training#2", "stopping", "checkpointing#2", "finished",
    ]  # fmt: skip
    assert took["loading_target"] == pytest.approx(1796094852.0666163 - 1796094850.7660604)
    assert took["training#2"] == pytest.approx(1796094858.5280137 - 1796094855.8444474)
    # No wait for the weights in this run: the load's length is not known from schema 1.
    assert hb.target_load_s() is None


def test_outcomes_of_the_old_runs():
    def outcome(run_dir: Path, checkpoint: str | None = None):
        hb = read_heartbeat(run_dir / "heartbeat.json")
        ex = read_exit(run_dir)
        assert not isinstance(hb, Unreadable) and isinstance(ex, ExitRecord)
        return outcome_of(False, hb, ex, checkpoint)

    done = outcome(FINISHED)
    assert (done.kind, done.summary) == ("finished", "finished at step 40 of 40")
    # The old agent listed this one as "exit 0 (finished)": it was stopped by SIGTERM.
    stop = outcome(STOPPED, "checkpoints/step-00000051.pt")
    assert (stop.kind, stop.summary) == (
        "stopped",
        "stopped at step 51 of 400, checkpoint checkpoints/step-00000051.pt: resumable",
    )
    assert stop.resumable
    crash = outcome(CRASHED)
    assert (crash.kind, crash.thread, crash.exit_code) == ("crashed", "drafter-0", 1)
    assert crash.summary == (
        "crashed in drafter-0 at step 15 of 400: InjectedFault: injected fault in drafter "
        "at item 15 (DFLASH_FAULT)"
    )
    # Only launch files: the old agent did not list it. It is a run that died before start.
    assert read_heartbeat(DIED / "heartbeat.json") is None and read_config(DIED) is None
    ex = read_exit(DIED)
    assert isinstance(ex, ExitRecord) and ex.exit_code == 2
    died = outcome_of(False, None, ex, None, "error: train.lr: expected a number, got 'abc'")
    assert (died.kind, died.summary) == (
        "died_before_start",
        "died before start (exit code 2): error: train.lr: expected a number, got 'abc'",
    )


def test_old_launch_and_exit_records():
    launch = read_launch(FINISHED)
    assert not isinstance(launch, Unreadable) and launch is not None
    assert (launch.pid, launch.pgid, launch.wrapper_pid, launch.name) == (
        4558,
        4558,
        4556,
        "tiny-cpu",
    )
    assert launch.overrides == ["train.max_steps=40", "train.checkpoint_every=20"]
    assert launch.proc_start is None  # schema 1 did not record it
    ex = read_exit(STOPPED)
    assert ex == ExitRecord(
        run_id="20261201-031436-tiny-cpu-b507",
        exit_code=0,
        signal=None,
        error=None,
        started_at=1796094876.8330579,
        ended_at=1796094892.9127035,
        final_phase="finished",
        step=51,
    )


def test_the_old_runs_are_comparable_with_each_other():
    sigs = []
    for run_dir in (FINISHED, STOPPED, CRASHED):
        config = read_config(run_dir)
        assert isinstance(config, dict)
        sigs.append(signature_of(config, hb_of(run_dir).devices))
    assert sigs[0] == sigs[1] == sigs[2]
    assert sigs[0].layout == "2 targets, 2 drafters" and sigs[0].device_kind == "cpu"
    assert all(comparable(sigs[0], s) for s in sigs)
    config = read_config(FINISHED)
    assert isinstance(config, dict)
    config["train"]["batch_size"] = 8
    assert not comparable(sigs[0], signature_of(config, hb_of(FINISHED).devices))


def test_a_newer_heartbeat_shows_what_it_knows_and_says_upgrade():
    data = json.loads((FINISHED / "heartbeat.json").read_text())
    data.update(schema=3, stage_times={"target": {"forward_ms": 12.0}}, phase="compacting")
    data["queues"] = {"q_pre": "a new shape", "q_hs": []}  # a field that changed type
    hb = parse_heartbeat(data)
    assert isinstance(hb, Heartbeat)
    assert hb.phase == "compacting" and hb.step == 40 and hb.queues == Queues()
    assert upgrade_note(hb) == "heartbeat schema 3: upgrade dflash-tui (this one reads 2)"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("{", "not JSON"),
        ("[1, 2]", "not a JSON object (list)"),
        ('{"schema": 1, "phase": "training"}', "run_id: missing"),
        ('{"schema": "1"}', "schema '1': not a dflash heartbeat this reader knows"),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_torn_or_foreign_heartbeats_are_unreadable_values(tmp_path, text, why):
    path = tmp_path / "heartbeat.json"
    path.write_text(text)
    got = read_heartbeat(path)
    assert isinstance(got, Unreadable) and why in got.why
    assert str(got).startswith("heartbeat.json unreadable: ")
