"""Record heartbeat.json fixtures from real CPU runs of the trainer:

    PYTHONPATH=. .venv/bin/python tests/infra/record_heartbeats.py [--out DIR]

Two runs of the tiny CPU config with their own compile cache (a temporary folder): the
first, short, leaves the cache's history (trainer/runtime/compile/progress.py); the second starts
with DFLASH_FAULT=slow:compile:S, so its compiling phase lasts S s instead of a blink (the CPU path
does not torch.compile). From the second run's dir, as its trainer wrote them:

- compiling-cpu.json: a heartbeat in the compiling phase, COMPILING_FOR_S into it;
- training-cpu.json: the first heartbeat at step >= STEP in which every pipeline thread has
  stage times (ThreadInfo.stages_ms).

Then compiling-gpu.json: compiling-cpu.json with only the compile progress a GPU run fills
(`compile.current`, `current_since`, `done`, `expected`, `last_s`, `last_cache` and
`phase_progress`) set to what a GPU warm-up says mid-way (README.md next to the files).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "heartbeats"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
COMPILE_S = 25  # DFLASH_FAULT=slow:compile:COMPILE_S
COMPILING_FOR_S = 10.0
STEP = 40
PIPELINE = ("prefetch", "target", "drafter")
# What a GPU warm-up's heartbeat says mid-way (the edits in compiling-gpu.json).
GPU_COMPILE = {
    "current": "graph 4: forward of 2/0, bucket 4096 on cuda:0",
    "done": 3,
    "expected": 6,
    "last_s": 30.6,
    "last_cache": "cold",
}
CURRENT_FOR_S = 12.0  # current_since: this long before the heartbeat's `now`


def trainer(run_root: Path, cache: Path, steps: int, fault: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    env.pop("DFLASH_FAULT", None)
    if fault:
        env["DFLASH_FAULT"] = fault
    argv = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(run_root)]
    argv += ["--max-steps", str(steps), "--set", "runtime.wandb_mode=disabled"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def heartbeat(run_root: Path) -> tuple[str, dict[str, Any]] | None:
    """The raw text and the parsed heartbeat of the (one) run under `run_root`."""
    for path in run_root.glob("*/heartbeat.json"):
        try:
            raw = path.read_text()
            return raw, json.loads(raw)
        except (OSError, ValueError):
            return None  # replaced as we read it: the next poll gets it
    return None


def wait_for(proc: subprocess.Popen[bytes], run_root: Path, ready: Any, what: str) -> str:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        got = heartbeat(run_root)
        if got is not None and ready(got[1]):
            return got[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the trainer exited ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise TimeoutError(what)


def compiling(hb: dict[str, Any]) -> bool:
    return hb["phase"] == "compiling" and hb["now"] - hb["phase_started_at"] >= COMPILING_FOR_S


def timed(hb: dict[str, Any]) -> bool:
    threads = [t for t in hb["threads"] if t["role"] in PIPELINE]
    return (
        hb["phase"] == "training"
        and hb["step"] >= STEP
        and bool(threads)
        and all(t.get("stages_ms") for t in threads)
    )


def gpu_compiling(raw: str) -> str:
    """compiling-cpu.json with the GPU warm-up's compile progress: the only edits."""
    hb = json.loads(raw)
    hb["compile"].update(GPU_COMPILE, current_since=hb["now"] - CURRENT_FOR_S)
    hb["phase_progress"] = {
        "done": GPU_COMPILE["done"],
        "total": GPU_COMPILE["expected"],
        "unit": "graphs",
    }
    return json.dumps(hb, indent=1, sort_keys=True) + "\n"  # the trainer's own layout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dflash-heartbeats-") as tmp:
        cache = Path(tmp) / "inductor"
        first = trainer(Path(tmp) / "first", cache, 20)
        if first.wait(400) != 0:
            raise RuntimeError(f"the first run exited {first.returncode}")
        proc = trainer(Path(tmp) / "runs", cache, 80, f"slow:compile:{COMPILE_S}")
        try:
            raw = wait_for(proc, Path(tmp) / "runs", compiling, "compiling")
            (args.out / "compiling-cpu.json").write_text(raw)
            (args.out / "compiling-gpu.json").write_text(gpu_compiling(raw))
            raw = wait_for(proc, Path(tmp) / "runs", timed, f"step {STEP} with stage times")
            (args.out / "training-cpu.json").write_text(raw)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"wrote compiling-cpu.json, compiling-gpu.json, training-cpu.json to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
