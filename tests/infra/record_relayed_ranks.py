"""Record the job's host's view of a processes-mode job over two hosts, from a real CPU run:

    PYTHONPATH=. .venv/bin/python tests/infra/record_relayed_ranks.py [--out DIR]

Two `python -m trainer` launchers on loopback, as `dflash-tui launch GROUP` starts them
(DFLASH_NODES=2, each its node rank and its own run root: no shared filesystem), each host 2
target ranks + 1 drafter rank with `runtime.routing = "node"`: ranks 0-2 on host a (rank 2
the writer), 3-5 on host b. Kept, byte for byte, at the first moment the writer's
heartbeat.json relays every rank of host b with its loop's stage times at step >= STEP:
host a's run dir's heartbeat.json and heartbeat-rank0..2.json (what a monitor on host a
reads), into tests/fixtures/ranks/two-hosts/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "ranks" / "two-hosts"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
STEP = 10
HOST_A, HOST_B = (0, 1, 2), (3, 4, 5)
RUN_ID = "two-hosts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(root: Path, node: int, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DFLASH_NODES": "2"}
    env.update(DFLASH_NODE_RANK=str(node), DFLASH_MASTER=f"127.0.0.1:{port}")
    env.pop("DFLASH_FAULT", None)
    argv = [sys.executable, "-m", "trainer", "--config", str(TINY)]
    argv += ["--run-dir", str(root / "runs" / RUN_ID), "--set", "runtime.mode=processes"]
    argv += ["--set", 'runtime.targets=["cpu","cpu"]', "--set", 'runtime.drafters=["cpu"]']
    argv += ["--set", "runtime.routing=node", "--set", "runtime.wandb_mode=disabled"]
    argv += ["--set", "train.max_steps=100000"]
    root.mkdir(parents=True)
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True
    )


def ready(run_dir: Path) -> dict[str, bytes] | None:
    """Host a's files as bytes once the relayed ranks are timed; else None."""
    try:
        raw = (run_dir / "heartbeat.json").read_bytes()
        relayed = json.loads(raw).get("ranks", {})
    except (OSError, ValueError):
        return None
    for r in HOST_B:
        beat = relayed.get(str(r), {}).get("beat", {})
        if not beat.get("stages_ms") or not beat.get("batches_s") or beat["step"] < STEP:
            return None
    files = {"heartbeat.json": raw}
    for r in HOST_A:
        try:
            files[f"heartbeat-rank{r}.json"] = (run_dir / f"heartbeat-rank{r}.json").read_bytes()
        except OSError:
            return None
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--timeout", type=float, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        jobs = [start(Path(tmp) / f"host-{h}", n, port) for n, h in enumerate("ab")]
        run_dir = Path(tmp) / "host-a" / "runs" / RUN_ID
        try:
            deadline = time.monotonic() + args.timeout
            while (files := ready(run_dir)) is None:
                assert time.monotonic() < deadline, f"no relayed ranks in {args.timeout} s"
                assert all(j.poll() is None for j in jobs), "a host's job ended"
                time.sleep(0.2)
        finally:
            for job in jobs:
                os.killpg(job.pid, signal.SIGTERM)
            for job in jobs:
                job.wait(60)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    for name, raw in files.items():
        (args.out / name).write_bytes(raw)
    print(f"two-hosts: {args.out}", flush=True)


if __name__ == "__main__":
    main()
