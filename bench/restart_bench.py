"""Time from `python -m trainer` to its first optimizer step, as a restart sees it.

    python3 bench/restart_bench.py --config trainer/configs/qwen3-8b-h200.toml [--set k=v]

Launches the real CLI, reads heartbeat.json until step >= 1, SIGTERMs it, and prints each
phase's duration. Run it twice: the second run finds the compile cache warm.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--timeout", type=float, default=400)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="restart-bench-"))
    argv = [sys.executable, "-m", "trainer", "--config", args.config, "--run-root", str(root)]
    for o in args.overrides:
        argv += ["--set", o]
    t0 = time.time()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    hb: dict = {}
    while time.time() - t0 < args.timeout:
        for d in root.iterdir():
            try:
                hb = json.loads((d / "heartbeat.json").read_text())
            except (OSError, ValueError):
                continue
        if hb.get("step", 0) >= 1 or proc.poll() is not None:
            break
        time.sleep(0.2)
    first_step = time.time() - t0
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if hb.get("step", 0) < 1:
        print(f"no step within {args.timeout}s (exit {proc.returncode}):\n{err[-3000:]}")
        return 1
    hist = hb.get("phase_history", [])
    durations = [
        f"{a['phase']} {b['started_at'] - a['started_at']:.1f}s"
        for a, b in itertools.pairwise(hist)
    ]
    print(
        json.dumps(
            {
                "first_step_s": round(first_step, 1),
                "warmup_s": hb.get("compile", {}).get("warmup_s"),
                "compile": hb.get("compile"),
                "phases": durations,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
