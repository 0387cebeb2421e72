"""runtime.routing "fixed" against "shared" with one target really slowed (issue 33 A1).

    .venv/bin/python bench/routing_bench.py [--steps 30] [--slow 1.5] [--rounds 1]

Each round runs the real trainer twice, one routing after the other, with the same command:
the tiny CPU config (2 target threads, 2 drafter replicas on the CPU), target 1 slowed by
DFLASH_FAULT=slow:target-1:SECONDS inside its forward. From each run's metrics.jsonl:

- tok/s: real tokens trained between the end of step `--skip` and the last step, over the
  time between them (the first steps carry start-up);
- drafter idle: each replica's median `wait q_hs` per loop (ms) and its share of the loop,
  and its share waiting at the step's barrier for the other replica (`wait replicas`), from
  the last row's per-thread stage times; and the drafters' idle seconds over the measured
  window (both waits' share × window, summed over the replicas).

Prints one JSON object per run and the ratios shared/fixed; `--out` keeps them.
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

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
WAIT_HS = "wait q_hs"  # features not there yet
WAIT_REPLICAS = "wait replicas"  # the step's barrier: a replica waits for the slowest one


def run_once(routing: str, steps: int, slow: float, skip: int, root: Path) -> dict:
    root.mkdir(parents=True)
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(root)]
    cmd += ["--max-steps", str(steps), "--set", f"runtime.routing={routing}"]
    cmd += ["--set", "runtime.wandb_mode=disabled", "--set", "train.log_every=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DFLASH_FAULT": f"slow:target-1:{slow}"}
    t0 = time.monotonic()
    done = subprocess.run(
        cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"{routing}: trainer exit {done.returncode}\n{done.stderr[-3000:]}")
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln]
    first, last = rows[skip - 1], rows[-1]
    window = last["time"] - first["time"]
    drafters = {k: v for k, v in last["stages_ms"].items() if k.startswith("drafter-")}

    def share(stages: dict[str, float], *names: str) -> float:
        return sum(stages.get(n, 0.0) for n in names) / max(1e-9, sum(stages.values()))

    idle = {k: share(v, WAIT_HS, WAIT_REPLICAS) for k, v in drafters.items()}
    return {
        "routing": routing,
        "steps": f"{first['step'] + 1}..{last['step']}",
        "tok_s": (last["tokens"] - first["tokens"]) / window,
        "steps_s": (last["step"] - first["step"]) / window,
        "wait_hs_ms": {k: v.get(WAIT_HS, 0.0) for k, v in drafters.items()},
        "wait_hs_share": {k: share(v, WAIT_HS) for k, v in drafters.items()},
        "wait_replicas_share": {k: share(v, WAIT_REPLICAS) for k, v in drafters.items()},
        "drafter_idle_s": sum(idle.values()) * window,
        "window_s": window,
        "wall_s": time.monotonic() - t0,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="steps left out of the measure")
    p.add_argument("--slow", type=float, default=1.5, help="seconds added to target 1's forward")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
        for i in range(args.rounds):
            for routing in ("fixed", "shared"):
                r = run_once(routing, args.steps, args.slow, args.skip, Path(tmp) / f"{routing}{i}")
                results.append(r)
                print(json.dumps(r), flush=True)
    by = {k: [r for r in results if r["routing"] == k] for k in ("fixed", "shared")}

    def mean(k: str, key: str) -> float:
        return sum(r[key] for r in by[k]) / len(by[k])

    summary = {
        "tok_s_ratio_shared_over_fixed": mean("shared", "tok_s") / mean("fixed", "tok_s"),
        "drafter_idle_ratio_shared_over_fixed": mean("shared", "drafter_idle_s")
        / max(1e-9, mean("fixed", "drafter_idle_s")),
    }
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps({"runs": results, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
