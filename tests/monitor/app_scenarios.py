"""Scripted event streams for the TUI: what an agent would send about an 8-GPU run.

Times are relative to a fixed NOW so that snapshots never change with the clock. The events
are dicts as the agent sends them; `typed()` puts them through the contract's decoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitor_helpers import typed_event

from dflash_tui.link.events import SinkEvent

NOW = 1_800_000_000.0
SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed-scenarios"
RUN = "20260520-094738-qwen36-27b-a1b2"
SHA = "9cc00a7b620d18c8" + "0" * 48
GIB = 1 << 30
# GPUs 0-3 target copies, GPU 4 prefetch/target, GPUs 5-7 drafter replicas (seed README).
ROLES = ["target"] * 5 + ["drafter"] * 3
# Both runs do the same work on the same hardware (trainer/contract/comparable.py).
SIGNATURE = {"shape": "qwen36-27b", "layout": "5 targets, 3 drafters", "device_kind": "NVIDIA H200"}


def typed(events: list[dict[str, Any]]) -> list[SinkEvent]:
    return [typed_event(e) for e in events]


def step_line(step: int, loss: float, toks: float, minutes: int) -> str:
    return (
        f"[{minutes}m] step={step} loss={loss:.4f} acc=0.120 streak=1.5 lr=4.40e-04 "
        f"noise=0.0366 | tgt=0.35b/s dft=0.35b/s ({toks / 1e3:.1f}Ktok/s) | "
        "q_pre=[50, 16, 2, 1, 10] q_hs=[60] | epoch~0.17 ETA=11.4d"
    )


def gpu_event(t: float, rows: list[tuple[int, int, int]]) -> dict[str, Any]:
    """rows: (index, MiB used, util %), as nvidia-smi printed them."""
    return {
        "type": "gpu",
        "t": t,
        "backend": "nvml",
        "devices": [
            {
                "index": i,
                "uuid": f"GPU-{i:08d}",
                "name": "NVIDIA H200",
                "mem_used": mib << 20,
                "mem_total": 143771 << 20,
                "util": util,
                "power_w": 120.0 + 5 * util,
                "temp_c": 40 + util // 4,
                "processes": [{"pid": 4242, "mem_used": mib << 20, "local": True}],
            }
            for i, mib, util in rows
        ],
    }


def seed_gpu_rows() -> list[tuple[int, int, int]]:
    rows = []
    for line in (SEED / "gpu_imbalance.csv").read_text().splitlines():
        idx, mem, util = (p.strip() for p in line.split(","))
        rows.append((int(idx), int(mem.split()[0]), int(util.split()[0])))
    return rows


def heartbeat(t: float, phase: str = "training", step: int = 876, **extra: Any) -> dict[str, Any]:
    threads = [
        {
            "name": f"target-{i}",
            "role": "target",
            "device": f"cuda:{i}",
            "state": "forward",
            "since": t - 0.2,
            "cpu_pct": 35.0,
        }
        for i in range(5)
    ]
    threads += [
        {
            "name": f"drafter-{i}",
            "role": "drafter",
            "device": f"cuda:{5 + i}",
            "state": "backward",
            "since": t - 0.1,
            "cpu_pct": 60.0,
        }
        for i in range(3)
    ]
    threads += [
        {
            "name": "prefetch-0",
            "role": "prefetch",
            "device": "cpu",
            "state": "building batch",
            "since": t - 1,
            "cpu_pct": 12.0,
        }
    ]
    hb = {
        "schema": 1,
        "run_id": RUN,
        "pid": 4242,
        "pgid": 4242,
        "host": "gpu-box",
        "now": t - 0.4,
        "started_at": t - 479 * 60,
        "phase": phase,
        "phase_started_at": t - 470 * 60,
        "phase_progress": None,
        "phase_history": [
            {"phase": "starting", "started_at": t - 479 * 60},
            {"phase": "compiling", "started_at": t - 475 * 60},
            {"phase": phase, "started_at": t - 470 * 60},
        ],
        "step": step,
        "total_steps": 100000,
        "last_step_at": t - 1.5,
        "tok_s": 14200.0,
        "tokens": 123456789,
        "epoch": 0.17,
        "queues": {
            "q_pre": [{"depth": d, "capacity": 64} for d in (50, 16, 2, 1, 10)],
            "q_hs": [{"depth": 60, "capacity": 96}],
        },
        "threads": threads,
        "memory": {
            f"cuda:{i}": {
                "allocated": 70 * GIB,
                "reserved": 79 * GIB,
                "peak": 79 * GIB,
                "alloc_retries": 0,
            }
            for i in range(8)
        },
        "devices": {f"cuda:{i}": {"uuid": f"GPU-{i:08d}", "name": "NVIDIA H200"} for i in range(8)},
        "compile": {
            "graphs": 10,
            "recompiles": 0,
            "warmup_s": 23.0,
            "cache_dir": "/c",
            "cache_hits": 10,
            "cache_misses": 0,
        },
        "code_sha256": SHA,
        "gil": {"probe_sleep_ms": 5.0, "p50_ms": 0.2, "p99_ms": 3.1, "samples": 200},
        "wandb": {
            "mode": "online",
            "id": "nloj6lfc",
            "url": "https://wandb.ai/aurorainfra/dflash-qwen36-27b/runs/nloj6lfc",
        },
        "error": None,
        "exit_code": None,
    }
    hb.update(extra)
    return hb


def healthy(now: float = NOW, steps: int = 40) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [
        {
            "type": "link",
            "t": now - 60,
            "state": "connected",
            "detail": "root@gpu-box via pct exec 200 --",
            "target": "gpu-box",
        },
        {"type": "rtt", "t": now - 5, "rtt_ms": 12.5},
        {
            "type": "hello",
            "t": now - 60,
            "version": 1,
            "pid": 77,
            "host": "gpu-box",
            "gpu_backend": "nvml",
            "deployed": {"sha256": SHA, "release": "/r", "at": now - 9e3},
        },
        {"type": "follow", "t": now - 59, "run_id": RUN, "run_dir": f"/workspace/runs/{RUN}"},
        {
            "type": "runs",
            "t": now - 59,
            "alive_run": RUN,
            "runs": [
                {
                    "run_id": "20260519-194100-qwen36-27b-0001",
                    "name": "qwen36-27b",
                    "alive": False,
                    "phase": "finished",
                    "step": 5000,
                    "exit": {"run_id": "20260519-194100-qwen36-27b-0001", "exit_code": 0},
                    "best_tok_s": 21500.0,
                    "steps": 5000,
                    "phases": {"compiling": 252.0, "training": 9000.0},
                    # Targets peaked at 80 GiB: this run's ~77 GB is as usual (it said 96 GiB
                    # until the GPU pane and memory_short used one number: the pane drew the
                    # targets red at 81% while the alerts said nothing was wrong).
                    "role_memory": {"target": 80 * GIB, "drafter": 79 * GIB},
                    "signature": SIGNATURE,
                    "created": now - 90000,
                },
                {
                    "run_id": RUN,
                    "name": "qwen36-27b",
                    "alive": True,
                    "phase": "training",
                    "step": 876,
                    "exit": None,
                    "best_tok_s": 14900.0,
                    "steps": 870,
                    "phases": {"compiling": 240.0},
                    "role_memory": {},
                    "signature": SIGNATURE,
                    "created": now - 479 * 60,
                },
            ],
        },
    ]
    for k in range(60):
        rows = [(i, 79000 + 300 * (i % 3) + 50 * (k % 5), 95 - (k + i) % 7) for i in range(8)]
        ev.append(gpu_event(now - 60 + k, rows))
    for j in range(steps):
        step = 876 - (steps - 1 - j) * 2
        toks = 14200 + 400 * ((j * 7) % 5) - 200
        loss = 1.3377 + 0.004 * (steps - j)
        t = now - 2 * (steps - j)
        ev.append(
            {
                "type": "line",
                "t": t,
                "run_id": RUN,
                "file": "train.log",
                "offset": 0,
                "end": 0,
                "text": step_line(step, loss, toks, 479),
            }
        )
        ev.append(
            {
                "type": "line",
                "t": t,
                "run_id": RUN,
                "file": "metrics.jsonl",
                "offset": 0,
                "end": 0,
                "text": json.dumps(
                    {
                        "step": step,
                        "loss": loss,
                        "acc": 0.1 + j * 0.0005,
                        "streak": 1.4 + j * 0.003,
                        "tok_s": toks,
                        "time": t,
                    }
                ),
            }
        )
    ev.append({"type": "heartbeat", "t": now - 0.4, "run_id": RUN, "data": heartbeat(now)})
    ev.append(
        {
            "type": "liveness",
            "t": now - 1,
            "run_id": RUN,
            "alive": True,
            "pid": 4242,
            "pgid": 4242,
            "exit": None,
        }
    )
    return ev


def alert_state(now: float = NOW) -> list[dict[str, Any]]:
    """The seed gpu_imbalance picture, then the run crashes in a drafter thread."""
    ev = healthy(now)
    ev.append(gpu_event(now - 1, seed_gpu_rows()))
    crashed = heartbeat(
        now,
        phase="crashed",
        exit_code=1,
        error={
            "thread": "drafter-1",
            "message": "RuntimeError: CUDA error: an illegal memory access",
            "traceback": "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: "
            "an illegal memory access",
        },
    )
    ev.append({"type": "heartbeat", "t": now - 0.3, "run_id": RUN, "data": crashed})
    ev.append(
        {
            "type": "liveness",
            "t": now - 0.2,
            "run_id": RUN,
            "alive": False,
            "pid": 4242,
            "pgid": 4242,
            "exit": {"run_id": RUN, "exit_code": 1, "signal": None, "final_phase": "crashed"},
        }
    )
    return ev
