"""Stack dumps of a live, compiled GPU run, taken the way an operator takes them: `dflash-tui
dump-stacks` on a run started by `dflash-tui launch`. Skipped without a GPU (run it on the
lent H200). Each of ten dumps must be the *named* Python stacks (the faulthandler fallback
does not count) and arrive within 2 s."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cli(*args: str, remote: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_tui.cli",
            args[0],
            "local",
            "--remote-dir",
            str(remote),
            *args[1:],
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
    )


def phase(remote: Path) -> str:
    r = cli("status", "--json", remote=remote, timeout=60)
    snapshots = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    snapshots = [s for s in snapshots if s.get("kind") == "snapshot"]
    return str((snapshots[-1].get("state") or {}).get("phase")) if snapshots else "?"


@cuda
def test_ten_named_stack_dumps_of_a_compiled_gpu_run(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    assert cli("deploy", remote=remote).returncode == 0
    r = cli(
        "launch",
        "--config",
        str(ROOT / "trainer" / "configs" / "tiny-gpu.toml"),
        "--set",
        "train.epochs=10000",
        "--set",
        "runtime.wandb_mode=disabled",
        remote=remote,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        deadline = time.monotonic() + 400  # a cold compile
        while (p := phase(remote)) != "training":
            assert p not in ("crashed", "finished", "stopped"), p
            assert time.monotonic() < deadline, f"still {p}"
            time.sleep(1)
        named, latencies = 0, []
        for _ in range(10):
            r = cli("dump-stacks", "--no-pyspy", remote=remote, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            text = r.stdout
            # The named dump: each pipeline thread by name and role (not the fallback).
            if 'Thread "drafter-0"' in text and "role=drafter@cuda" in text:
                named += 1
            m = re.search(r"# (\w+) dump of pid \d+, ([\d.]+)s after the signal", text)
            assert m, text[-500:]
            latencies.append(float(m.group(2)))
            time.sleep(0.5)
        print("dump-stacks: signal -> dump (s):", latencies)
        for log in remote.glob("runs/*/train.log"):  # which library took the signals, if any
            print(*(x for x in log.read_text().splitlines() if "signals:" in x))
        assert named == 10, f"{named} of 10 dumps were the named stacks"
        assert max(latencies) < 2.0, latencies
    finally:
        cli("kill", "--timeout", "60", remote=remote)
