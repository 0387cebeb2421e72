"""A schema-2 run dir written on an H200 through dflash-tui (tests/fixtures/rundirs/
h200-schema2/README.md), read by the contract's readers with exact values."""

from __future__ import annotations

from pathlib import Path

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.outcomes import outcome_of
from trainer.contract.phases import phase_spans
from trainer.contract.records import ExitRecord, parse_metrics_line, read_exit, read_launch
from trainer.contract.telemetry import read_telemetry
from trainer.contract.typed import Unreadable

RUN = (
    Path(__file__).resolve().parents[1]
    / "fixtures/rundirs/h200-schema2/20261201-052645-tiny-gpu-2735"
)


def test_the_heartbeat_of_a_stopped_gpu_run():
    hb = read_heartbeat(RUN / "heartbeat.json")
    assert isinstance(hb, Heartbeat)
    assert (hb.schema, hb.phase, hb.step, hb.total_steps, hb.exit_code) == (
        2, "stopped", 366, 5000, 0,
    )  # fmt: skip
    assert hb.devices["cuda:0"].name == "NVIDIA H200"
    assert hb.devices["cuda:0"].uuid == "GPU-6e580b1b-4fe5-02d8-b3d3-01ebfbbc8f2c"
    assert hb.last_checkpoint is not None
    assert (hb.last_checkpoint.step, hb.last_checkpoint.path) == (
        366,
        "checkpoints/step-00000366.pt",
    )
    assert hb.proc_start is not None and hb.proc_start > 0
    assert hb.compile.graphs == 7 and hb.compile.recompiles == 0 and hb.compile.cache_misses == 18
    # The weights were in before the compile ended: no wait visit; the load's span says so.
    assert hb.target_load is not None and hb.target_load_s() is not None
    assert hb.target_load_s() < 1.0
    keys = [s.key for s in phase_spans(hb.phase_history, final=True)]
    assert keys == [
        "starting", "loading_data", "loading_target", "compiling", "warmup",
        "training", "checkpointing", "training#2", "checkpointing#2", "training#3",
        "checkpointing#3", "training#4", "stopping", "checkpointing#4", "stopped",
    ]  # fmt: skip
    assert hb.role_peaks().keys() == {"target", "drafter"}


def test_its_exit_launch_metrics_and_telemetry():
    ex = read_exit(RUN)
    assert isinstance(ex, ExitRecord)
    assert (ex.exit_code, ex.signal, ex.final_phase, ex.step, ex.total_steps) == (
        0, None, "stopped", 366, 5000,
    )  # fmt: skip
    assert ex.checkpoint == "checkpoints/step-00000366.pt"
    launch = read_launch(RUN)
    assert launch is not None and not isinstance(launch, Unreadable)
    assert launch.proc_start is not None and launch.pid == launch.pgid
    hb = read_heartbeat(RUN / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and launch.proc_start == hb.proc_start  # one process
    rows = [parse_metrics_line(ln) for ln in (RUN / "metrics.jsonl").read_text().splitlines()]
    assert [r.step for r in rows if not isinstance(r, Unreadable)] == [
        50,
        100,
        150,
        200,
        250,
        300,
        350,
    ]
    beats, skipped = read_telemetry(RUN / "telemetry.jsonl")
    assert skipped == 0 and len(beats) == 18 and beats[-1].phase == "stopped"
    outcome = outcome_of(False, hb, ex)
    assert outcome.summary == (
        "stopped at step 366 of 5000, checkpoint checkpoints/step-00000366.pt: resumable"
    )
