"""DFLASH_PROFILE: a profiler window over a real run's steps, and the report that splits it."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_CONFIG
from trainer.reporting.profile_window import parse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from profile_report import report  # noqa: E402  (bench/)


def test_the_spec():
    assert parse("150:4") == (150, 4)
    for bad in ("150", "a:4", "0:4", "3:0", "3:-1"):
        with pytest.raises(ValueError, match="DFLASH_PROFILE="):
            parse(bad)


def test_a_run_records_its_window_with_every_thread_s_stages(tmp_path):
    """The real trainer (the tiny CPU config, 2 target + 2 drafter threads): steps 4-5 are
    recorded, the trace lands in the run dir, train.log says so, and the trace holds the
    named stages of the target threads as well as the drafter thread that started it (the
    prefetch threads have built every batch of so short a run before the window opens).
    24 steps: with 8, the targets had made every step's features before the window opened
    in a loaded run, and none of their forwards fell inside it."""
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(TINY_CONFIG), "--run-root",
         str(tmp_path), "--max-steps", "24", "--set", "runtime.wandb_mode=disabled"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "DFLASH_PROFILE": "3:2"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    log = (run_dir / "train.log").read_text()
    assert "profile: recording steps 4-5" in log
    assert "trace in profile/steps-4-5.json.gz" in log
    with gzip.open(run_dir / "profile" / "steps-4-5.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    stages = {e["name"] for e in events if str(e.get("name", "")).startswith("stage:")}
    assert "stage:drafter-0:forward" in stages and "stage:drafter-0:backward" in stages
    assert {"stage:target-0:forward", "stage:target-1:forward"} <= stages


def test_a_bad_spec_is_said_and_nothing_is_profiled(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(TINY_CONFIG), "--run-root",
         str(tmp_path), "--max-steps", "3", "--set", "runtime.wandb_mode=disabled"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "DFLASH_PROFILE": "soon"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (
        "profile: DFLASH_PROFILE='soon': expected START:STEPS"
        in (run_dir / "train.log").read_text()
    )
    assert not (run_dir / "profile").exists()


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_the_report_splits_kernels_by_stream_stage_and_class():
    """Two steps of a hand-made trace (microseconds): the drafter thread (tid 5) launches a
    layer GEMM and an lm_head GEMM in its forward and the fused Adam kernel in its optimizer
    stage on stream 7; the target thread (tid 6) a GEMM and a flash kernel on stream 13."""
    ev = [
        _x("stage:drafter-0:forward", "user_annotation", 0, 100, tid=5),
        _x("aten::mm", "cpu_op", 10, 5, tid=5, **{"Input Dims": [[8192, 4096], [4096, 4096]]}),
        _x("cudaLaunchKernel", "cuda_runtime", 11, 1, tid=5, correlation=1),
        _x("aten::mm", "cpu_op", 20, 5, tid=5, **{"Input Dims": [[8192, 4096], [4096, 151936]]}),
        _x("cudaLaunchKernel", "cuda_runtime", 21, 1, tid=5, correlation=2),
        _x("stage:drafter-0:optimizer", "user_annotation", 200, 50, tid=5),
        _x("cudaLaunchKernel", "cuda_runtime", 201, 1, tid=5, correlation=3),
        _x("stage:target-0:forward", "user_annotation", 0, 300, tid=6),
        _x("cudaLaunchKernel", "cuda_runtime", 1, 1, tid=6, correlation=4),
        _x("cudaLaunchKernel", "cuda_runtime", 2, 1, tid=6, correlation=5),
        _x("nvjet_hsh_256x128", "kernel", 1000, 400, stream=7, correlation=1),
        _x("nvjet_hsh_256x128", "kernel", 1400, 600, stream=7, correlation=2),
        _x(
            "void multi_tensor_apply_kernel<FusedAdam>",
            "kernel",
            2000,
            200,
            stream=7,
            correlation=3,
        ),
        _x("sm90_xmma_gemm_bf16", "kernel", 1200, 1000, stream=13, correlation=4),
        _x("flash_fwd_kernel", "kernel", 2200, 200, stream=13, correlation=5),
        _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 2600, 200, stream=20),
    ]
    r = report(ev, steps=2)
    split = {(x["stream"], x["stage"], x["class"]): x["ms"] for x in r["split_ms"]}
    assert split == {
        ("7 (drafter-0)", "drafter-0:forward", "gemm"): 0.2,
        ("7 (drafter-0)", "drafter-0:forward", "lm_head gemm"): 0.3,
        ("7 (drafter-0)", "drafter-0:optimizer", "optimizer"): 0.1,
        ("13 (target-0)", "target-0:forward", "gemm"): 0.5,
        ("13 (target-0)", "target-0:forward", "attention"): 0.1,
        ("20 (?)", "?", "copy"): 0.1,
    }
    # 1000..2800 us: busy 1000-2400 and 2600-2800 (1.6 ms), idle 2400-2600; streams 7 and 13
    # ran together 1200-2200 (1.0 ms). Per step: halves.
    assert r["wall_ms"] == pytest.approx(0.9)
    assert r["busy_ms"] == pytest.approx(0.8)
    assert r["idle_ms"] == pytest.approx(0.1)
    assert r["overlap_ms"] == pytest.approx(0.5)
