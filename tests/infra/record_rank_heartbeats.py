"""Record a processes-mode job's rank heartbeats from real CPU runs of the trainer:

    PYTHONPATH=. .venv/bin/python tests/infra/record_rank_heartbeats.py [--out DIR] [NAME ...]

Each scenario runs the tiny CPU config as a torchrun job of 4 ranks (targets 0-1, drafters
2-3: `runtime.mode=processes`), one fault injected for real with DFLASH_FAULT, and keeps
the job's files as its ranks wrote them, byte for byte, at the first moment every rank's
heartbeat-rank{R}.json has its loop's stage times (`stages_ms`) and a rate, at step >= STEP:

- heartbeat-rank0.json … heartbeat-rank3.json, and the writer rank's heartbeat.json.

Scenarios (SCENARIOS): `healthy` (no fault), `slow-drafter` (drafter rank 3's forward
slowed), `slow-target` (target rank 1's forward slowed), `slow-link` (every target rank's
sends slowed: the link, as the senders see it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "ranks"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
STEP = 25
RANKS = 4
SCENARIOS = {
    "healthy": "",
    "slow-drafter": "slow:drafter:0.4:rank=3",
    "slow-target": "slow:target:0.4:rank=1",
    "slow-link": "slow:link:1.0",
}


def start(run_root: Path, fault: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DFLASH_FAULT", None)
    if fault:
        env["DFLASH_FAULT"] = fault
    argv = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(run_root)]
    argv += ["--set", "runtime.wandb_mode=disabled", "--set", "runtime.mode=processes"]
    argv += ["--set", "train.max_steps=100000"]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True
    )


def ready(run_dir: Path) -> dict[str, bytes] | None:
    """Every rank file (and the job's heartbeat) as bytes, once all are timed; else None."""
    files: dict[str, bytes] = {}
    for r in range(RANKS):
        try:
            raw = (run_dir / f"heartbeat-rank{r}.json").read_bytes()
            beat = json.loads(raw)
        except (OSError, ValueError):
            return None
        if not beat.get("stages_ms") or not beat.get("batches_s") or beat["step"] < STEP:
            return None
        files[f"heartbeat-rank{r}.json"] = raw
    try:
        files["heartbeat.json"] = (run_dir / "heartbeat.json").read_bytes()
    except OSError:
        return None
    return files


def record(name: str, fault: str, out: Path, timeout: float = 300) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(Path(tmp), fault)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert time.monotonic() < deadline, f"{name}: no timed ranks in {timeout} s"
                assert proc.poll() is None, f"{name}: the job ended ({proc.returncode})"
                runs = [p for p in Path(tmp).iterdir() if p.is_dir()]
                files = ready(runs[0]) if runs else None
                if files:
                    break
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for file, raw in files.items():
        (dest / file).write_bytes(raw)
    print(f"{name}: {dest}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("names", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    for name in args.names:
        record(name, SCENARIOS[name], args.out)


if __name__ == "__main__":
    main()
