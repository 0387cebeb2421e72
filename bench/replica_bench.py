"""processes mode's drafter replicas on DDP against the hand-written reduce, on real jobs.

    python3 bench/replica_bench.py [--baseline REF] [--steps 80] [--rounds 2] [--out r.json]

Real torchrun jobs of the trainer on CPU (gloo): the tiny config's 2 target ranks + 2
drafter ranks, `--steps` steps, one job at a time:

  hand-written  the trainer at git REF (default: main), whose drafter ranks all-reduce one
                flat fp32 buffer of every gradient after backward; run from a git worktree
                of REF, so this tree keeps no copy of it
  ddp fp32      this tree: DDP's buckets during backward (trainer/distributed/replica_sync.py)
  ddp bf16      this tree, runtime.grad_reduce_dtype = "bf16"
  threads       this tree, threads mode (2 target threads, 2 replicas): the reference losses

Each round runs a hand-written and a DDP job side by side (the box's other load falls on
both alike); the step time of a job is its steady pace (the metrics' elapsed time from step
10 to the last, per step), the ratio is DDP's over the hand-written one of the same round,
and the table gives the median over `--rounds`; then the bf16 and threads jobs, side by side.
Losses: the largest relative difference per step, DDP fp32 against threads mode and bf16
against fp32. Memory: each drafter rank's peak RSS over its metrics rows (on CPU the
trainer's memory figure is the process's RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = "trainer/configs/tiny-cpu.toml"
QUIET = ["--set", "runtime.wandb_mode=disabled", "--set", "train.log_every=1"]
WARM = 10  # steps before the pace is measured (first steps compile nothing on CPU, but warm)


def start(tree: Path, root: Path, steps: int, *extra: str, processes: bool = True) -> Job:
    """One job of the trainer in `tree`, started, its run under `root`."""
    root.mkdir(parents=True)
    cmd = [sys.executable]
    if processes:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    cmd += ["-m", "trainer", "--config", str(tree / TINY), "--run-root", str(root)]
    if processes:
        cmd += ["--set", "runtime.mode=processes"]
    cmd += [*QUIET, "--max-steps", str(steps), *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with open(root / "out.txt", "wb") as out:
        return Job(root, subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=out))


class Job:
    def __init__(self, root: Path, proc: subprocess.Popen[bytes]) -> None:
        self.root, self.proc = root, proc

    def run_dir(self) -> Path:
        """Waits for the job; its run dir."""
        if (code := self.proc.wait()) != 0:
            sys.exit(f"a job failed ({code}): {self.root / 'out.txt'}")
        (run_dir,) = [p for p in self.root.iterdir() if p.is_dir()]
        return run_dir


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def pace_ms(run_dir: Path) -> float:
    m = rows(run_dir / "metrics.jsonl")
    return (m[-1]["elapsed_s"] - m[WARM - 1]["elapsed_s"]) / (len(m) - WARM) * 1e3


def drafter_peaks_mb(run_dir: Path) -> list[float]:
    """Each drafter rank's peak RSS: the writer's metrics, then ranks/rank-3's."""
    out = []
    for path in (run_dir / "metrics.jsonl", run_dir / "ranks" / "rank-3" / "metrics.jsonl"):
        peaks = [d["peak"] for m in rows(path) for d in m.get("memory", {}).values()]
        out.append(max(peaks) / 2**20)
    return out


def drafter_stages(run_dir: Path) -> dict[str, float]:
    """The writer's drafter thread's stage medians (ms per step) at the last row."""
    stages: dict[str, float] = rows(run_dir / "metrics.jsonl")[-1]["stages_ms"]["drafter-0"]
    return stages


def losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in rows(run_dir / "metrics.jsonl")]


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="main", help="git ref with the hand-written reduce")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="replica-bench-"))
    base = work / "baseline-tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True
    )
    try:
        res: dict[str, Any] = {"steps": args.steps, "baseline": args.baseline, "rounds": []}
        for i in range(args.rounds):
            # Side by side: the box's other load falls on both alike.
            pair = (
                start(base, work / f"hand-{i}", args.steps),
                start(ROOT, work / f"ddp-{i}", args.steps),
            )
            hand, ddp = pair[0].run_dir(), pair[1].run_dir()
            hand_ms, ddp_ms = pace_ms(hand), pace_ms(ddp)
            rnd = {
                "hand_ms": hand_ms,
                "ddp_ms": ddp_ms,
                "ratio": ddp_ms / hand_ms,
                "hand_peak_mb": drafter_peaks_mb(hand),
                "ddp_peak_mb": drafter_peaks_mb(ddp),
                "hand_stages": drafter_stages(hand),
                "ddp_stages": drafter_stages(ddp),
            }
            print(f"round {i}: {json.dumps(rnd)}", flush=True)
            res["rounds"].append(rnd)
        half = start(ROOT, work / "bf16", args.steps, "--set", "runtime.grad_reduce_dtype=bf16")
        whole = start(ROOT, work / "threads", args.steps, processes=False)
        bf16, threads = half.run_dir(), whole.run_dir()
        fp32 = losses(ddp)
        res["ratio_median"] = statistics.median(r["ratio"] for r in res["rounds"])
        res["ddp_vs_threads_max_rel"] = max_rel(fp32, losses(threads))
        res["bf16_vs_fp32_max_rel"] = max_rel(losses(bf16), fp32)
        res["final_loss"] = {"fp32": fp32[-1], "bf16": losses(bf16)[-1]}
        res["bf16_ms"] = pace_ms(bf16)
        print(json.dumps(res, indent=2))
        if args.out:
            args.out.write_text(json.dumps(res, indent=2) + "\n")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
