"""Stage timings: the clock itself, and a real CPU run whose heartbeat and metrics carry each
pipeline thread's stages, adding up to the loop's period."""

from __future__ import annotations

import json
import signal
import statistics
import time

import pytest
import torch

from trainer.contract.heartbeat import ROLE_STAGES, Heartbeat, ordered_stages, read_heartbeat
from trainer.reporting.stages import StageClock


def test_a_cpu_clock_times_each_stage_per_iteration():
    clock = StageClock("cpu")
    for _ in range(5):
        clock.lap()
        with clock.wait("wait q_pre"):
            time.sleep(0.010)
        with clock.work("forward"):
            time.sleep(0.020)
        with clock.work("forward"):  # twice in one iteration: one sample, the sum
            time.sleep(0.005)
    clock.lap()
    ms = clock.medians_ms()
    assert list(ms) == ["wait q_pre", "forward"]
    assert 9 <= ms["wait q_pre"] < 20 and 24 <= ms["forward"] < 40


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_clock_times_the_stream_not_the_launch():
    """torch.cuda._sleep queues a kernel that spins on the GPU: the host returns at once, the
    stream is busy. The clock must see the kernel's time and the gap it was made to wait."""
    clock = StageClock("cuda:0")
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 0.02)  # ~20 ms
    for _ in range(6):
        clock.lap()
        with clock.wait("wait q_hs"):
            time.sleep(0.030)  # the stream idles while the host waits
        with clock.work("forward"):
            torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    clock.lap()
    ms = clock.medians_ms()
    assert 12 <= ms["forward"] <= 40, ms
    assert ms["wait q_hs"] >= 5, ms


def test_a_real_run_reports_every_pipeline_threads_stages(start_trainer):
    p = start_trainer("--max-steps", "100000", "--set", "train.log_every=2")
    p.wait_step(25)
    hb = read_heartbeat(p.run_dir / "heartbeat.json")
    assert isinstance(hb, Heartbeat)
    by_role: dict[str, list] = {}
    for t in hb.threads:
        if t.role in ROLE_STAGES:
            assert t.stages_ms, f"{t.name} reports no stages"
            by_role.setdefault(t.role, []).append(t)
            # every name is one of the role's stages (or `host`), in loop order once ordered
            names = [n for n, _ in ordered_stages(t.role, t.stages_ms)]
            assert set(names) <= set(ROLE_STAGES[t.role]), (t.name, names)
        else:
            assert not t.stages_ms  # main, heartbeat, probe: no loop to time
    assert set(by_role) == {"prefetch", "target", "drafter"}
    d0 = next(t for t in by_role["drafter"] if t.name == "drafter-0")
    assert {"forward", "backward", "optimizer"} <= set(d0.stages_ms)
    # The drafter's stages add up to its step: compare with the steps' own rate.
    rows = p.metrics()
    recent = rows[-6:]
    step_ms = statistics.median(1e3 * 2 / r["dft_bps"] for r in recent)  # 2 replicas per step
    total = sum(d0.stages_ms.values())
    assert 0.6 * step_ms <= total <= 1.5 * step_ms, (total, step_ms, d0.stages_ms)
    # metrics.jsonl carries the same, per thread by name
    last = json.loads(p.run_dir.joinpath("metrics.jsonl").read_text().splitlines()[-1])
    assert set(last["stages_ms"]) >= {"prefetch-0", "target-0", "drafter-0", "drafter-1"}
    p.signal(signal.SIGTERM)
    assert p.wait() == 0
