"""DFLASH_FAULT: the grammar, and each fault travelling the real path in a real trainer."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import TINY_CONFIG
from trainer.config import load_config
from trainer.model.optim import lr_at
from trainer.runtime.faults import FaultPlan


def test_the_grammar():
    plan = FaultPlan("target:3, hang:drafter:7,nan:20,slow:prefetch:0.5,slow:load_target:4,"
                     "sigkill:25,stall_checkpoint:30")  # fmt: skip
    assert plan.raise_at == {"target": 3} and plan.hang_at == {"drafter": 7}
    assert plan.nan_from == 20 and plan.sigkill_after == 25 and plan.checkpoint_stall_s == 30
    assert plan.slow == {"prefetch": 0.5, "load_target": 4.0}
    assert not plan.poison_loss(19) and plan.poison_loss(20)
    assert FaultPlan("").raise_at == {} and FaultPlan("").slow_s("data") == 0.0
    assert FaultPlan("hang:drafter-1:30").hang_at == {"drafter-1": 30}
    assert FaultPlan("buffer_log:8192").log_buffer_bytes == 8192
    assert FaultPlan("").log_buffer_bytes is None


def test_a_fault_for_one_rank_is_that_rank_s_only(monkeypatch):
    """`:rank=R`: torchrun's rank R (its RANK) takes the fault, every other rank (and a
    threads-mode run, without RANK) runs clean; a bad fault fails on every rank alike."""
    spec = "slow:drafter:0.4:rank=3,slow:link:0.2"
    monkeypatch.setenv("RANK", "3")
    assert FaultPlan(spec).slow == {"drafter": 0.4, "link": 0.2}
    monkeypatch.setenv("RANK", "2")
    assert FaultPlan(spec).slow == {"link": 0.2}
    monkeypatch.delenv("RANK")
    assert FaultPlan(spec).slow == {"link": 0.2}
    with pytest.raises(ValueError, match="DFLASH_FAULT="):
        FaultPlan("slow:gpu:1:rank=3")  # not rank 3, still refused
    with pytest.raises(ValueError, match="DFLASH_FAULT="):
        FaultPlan("slow:drafter:1:rank=x")


@pytest.mark.parametrize(
    "spec",
    [
        "gpu:3", "target:x", "slow:target:-1", "slow:target:inf", "hang:main:1", "nan",
        "buffer_log:x", "hang:drafter-x:1", "hang:gpu-1:1", "slow:target-x:1",
        "slow:link-1:1",
        "slow_from:5:main:1", "slow_from:x:drafter:1", "slow_from:5:drafter:-1",
        "slow_from:5:drafter", "slow_from:2.5:drafter:1", "slow_from:5:load_target:1",
    ],
)  # fmt: skip
def test_a_bad_spec_names_itself(spec):
    with pytest.raises(ValueError, match="DFLASH_FAULT="):
        FaultPlan(spec)


def test_slow_from_slows_a_role_once_the_optimizer_passed_its_step():
    plan = FaultPlan("slow_from:3:drafter:0.3")
    assert plan.slow_from == {"drafter": (3, 0.3)} and plan.slow == {}

    def took(role: str) -> float:
        t0 = time.monotonic()
        plan.check(role, 0)
        return time.monotonic() - t0

    plan.after_step(2)
    assert took("drafter") < 0.1  # steps 1 and 2: as fast as before
    plan.after_step(3)
    assert took("drafter") >= 0.3 and took("target") < 0.1  # only the role named


def test_slow_of_one_thread_slows_that_thread_only():
    """slow:target-1:S: one straggling target (bench/routing_bench.py), its peers as fast."""
    plan = FaultPlan("slow:target-1:0.3")
    assert plan.slow == {"target-1": 0.3}

    def took(role: str, index: int) -> float:
        t0 = time.monotonic()
        plan.check(role, 0, index)
        return time.monotonic() - t0

    assert took("target", 1) >= 0.3
    assert took("target", 0) < 0.1 and took("drafter", 1) < 0.1


def test_the_training_health_faults():
    plan = FaultPlan("diverge:30:1000,grad_spike:10:5:100")
    assert [plan.lr_factor(s) for s in (0, 29, 30, 500)] == [1.0, 1.0, 1000.0, 1000.0]
    assert [plan.loss_scale(s) for s in (9, 10, 11, 14, 15, 20)] == [1, 100, 1, 1, 100, 100]
    zero = FaultPlan("zero_lr")
    assert zero.lr_factor(0) == zero.lr_factor(99) == 0.0 and zero.loss_scale(3) == 1.0
    assert FaultPlan("").lr_factor(7) == 1.0 and FaultPlan("").loss_scale(7) == 1.0


@pytest.mark.parametrize("spec", ["diverge:3", "grad_spike:3:0:10", "zero_lr:4", "diverge:x:2"])
def test_a_bad_training_health_spec_names_itself(spec):
    with pytest.raises(ValueError, match="DFLASH_FAULT="):
        FaultPlan(spec)


def test_diverge_and_grad_spike_on_a_real_run(start_trainer):
    """The faults act on the real optimizer path: the lr the optimizer applied is the one
    logged (10× from step 6), and a loss scaled before its backward at step 2 gives that
    row a gradient norm ~1000× the others' (pre-clip: grad_clip stays on)."""
    p = start_trainer(
        "--max-steps", "8", "--set", "train.log_every=2",
        env={"DFLASH_FAULT": "grad_spike:2:100:1000,diverge:6:10"},
    )  # fmt: skip
    assert p.wait(timeout=240) == 0, p.stdout_path.read_text()[-2000:]
    rows = {m["step"]: m for m in p.metrics()}
    cfg = load_config(TINY_CONFIG).train
    # A row's lr is its last optimizer step's (optimizer step s ends at step s + 1).
    assert rows[6]["lr"] == pytest.approx(lr_at(5, 8, cfg))
    assert rows[8]["lr"] == pytest.approx(10 * lr_at(7, 8, cfg))
    others = [rows[s]["grad_norm"] for s in (2, 6, 8)]
    assert rows[4]["grad_norm"] > 100 * max(others)  # step 2 (0-based) is in row 4


def test_a_bad_spec_is_bad_input_for_the_trainer(start_trainer):
    p = start_trainer("--max-steps", "3", env={"DFLASH_FAULT": "warp:9"})
    assert p.wait(timeout=60) == 2
    out = p.stdout_path.read_text()
    assert "DFLASH_FAULT='warp:9'" in out and "Traceback" not in out


def test_nan_and_sigkill_on_a_real_run(start_trainer):
    p = start_trainer(
        "--max-steps", "400", "--set", "train.log_every=2",
        env={"DFLASH_FAULT": "nan:4,sigkill:8"},
    )  # fmt: skip
    assert p.wait(timeout=120) == -signal.SIGKILL
    losses = [m["loss"] for m in p.metrics()]
    assert losses[:2] == [pytest.approx(losses[0]), pytest.approx(losses[1])]
    assert losses[0] == losses[0] and losses[-1] != losses[-1]  # finite, then NaN
    hb = p.heartbeat()
    assert hb["phase"] == "training" and hb["exit_code"] is None  # no handler ran


def test_a_buffered_log_holds_its_step_lines_while_metrics_come_line_by_line(start_trainer):
    """buffer_log: train.log in 64 KB blocks (30 steps' lines fit in one), metrics.jsonl as
    always: mid-run the metrics have rows and the log no step line; at the end, all of them."""
    p = start_trainer(
        "--max-steps", "30", "--set", "train.log_every=2",
        env={"DFLASH_FAULT": "buffer_log:65536"},
    )  # fmt: skip
    p.wait_for(lambda: len(p.metrics()) >= 4, what="4 metrics rows")
    assert "step=" not in p.read("train.log")
    assert p.wait(timeout=120) == 0
    assert p.read("train.log").count(" step=") == len(p.metrics()) == 15


def test_a_hung_thread_stops_the_steps_not_the_heartbeat(start_trainer):
    p = start_trainer("--max-steps", "400", env={"DFLASH_FAULT": "hang:target:6"})
    p.wait_step(2)
    time.sleep(6)
    first = p.heartbeat()
    time.sleep(3)
    hb = p.heartbeat()
    assert hb["step"] == first["step"] and hb["now"] > first["now"] + 2
    # Each target thread hangs at its own 7th batch, inside its forward.
    targets = [t for t in hb["threads"] if t["role"] == "target"]
    assert targets and all(t["state"] == "forward" for t in targets)
    assert all(hb["now"] - t["since"] > 5 for t in targets)
    p.kill()


def test_a_slow_checkpoint_does_not_break_the_replicas_barrier(start_trainer):
    """Replica 0 checkpoints inside the optimizer step while the others wait at the barrier;
    a save of a few seconds (a big drafter, a slow disk) must not crash the run."""
    p = start_trainer(
        "--max-steps", "12", "--set", "train.checkpoint_every=5",
        env={"DFLASH_FAULT": "stall_checkpoint:3"},
    )  # fmt: skip
    assert p.wait(timeout=120) == 0, p.stdout_path.read_text()[-2000:]
    hb = p.heartbeat()
    assert hb["phase"] == "finished" and hb["step"] == 12
    names = sorted(c.name for c in p.run_dir.glob("checkpoints/step-*.pt"))
    assert names == ["step-00000005.pt", "step-00000010.pt", "step-00000012.pt"]
