"""`dflash-tui demo --headless` is over when its run is (issue 16: it never exited): the
outcome line, exit 0 for a run that finished, non-zero for one that crashed; and `runs
--json` of what it left is JSON. The real CPU demo (trainer/configs/demo-cpu.toml), cut
short and on the tiny target and data the other CLI tests train (tiny-cpu.toml's, by
`--set`, as an operator may): what is tested here is the demo's end, not its model (the
demo's own chat target and answers come from prebuilt/ when they match their builder:
tests/trainer/test_prebuilt.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from monitor_helpers import NO_WANDB

ROOT = Path(__file__).resolve().parents[2]


QUICK = ("target.path=builtin:tiny-qwen3", "data.path=builtin:synthetic-chat", "eval.every=1000")


def demo(remote: Path, *sets: str, env: dict[str, str] | None = None):
    args = ["demo", "--headless", "--interval", "1", "--remote-dir", str(remote)]
    for s in (NO_WANDB, *QUICK, *sets):
        args += ["--set", s]
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def kill_left(remote: Path) -> None:
    """A failed test leaves no trainer behind (the demo's run is detached by design)."""
    subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", "kill", "local", "--remote-dir", str(remote)],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )


def launched(stderr: str) -> str:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("demo: launched "))
    return line.removeprefix("demo: launched ")


def test_the_headless_demo_exits_with_its_runs_outcome(tmp_path, tiny_target_dir):
    remote = tmp_path / "demo"
    try:
        r = demo(remote, "train.max_steps=30")
    finally:
        kill_left(remote)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_id = launched(r.stderr)
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{run_id} finished at step 30"), last
    assert "the run goes on until it finishes" not in r.stderr  # it did finish
    status_lines = [ln for ln in r.stdout.splitlines() if " | q_pre " in ln]
    assert status_lines and all(" q_hs " in ln for ln in status_lines)
    # Each queue as depth/capacity, two targets' and two drafters': `8/8 8/8 q_hs 4/8 0/8`
    queues = status_lines[-1].split(" | q_pre ")[1].split(" | ")[0]
    pre, hs = queues.split(" q_hs ")
    for depths in (pre, hs):
        assert len(depths.split()) == 2, queues
        for q in depths.split():
            depth, capacity = map(int, q.split("/"))
            assert 0 <= depth <= capacity and capacity > 0, queues

    where = ["local", "--remote-dir", str(remote)]
    listed = subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", "runs", *where, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert [(x["run_id"], x["steps"], x["outcome"]["kind"]) for x in runs] == [
        (run_id, 30, "finished")
    ]


def test_the_headless_demo_of_a_crash_exits_non_zero_saying_so(tmp_path, tiny_target_dir):
    remote = tmp_path / "demo"
    try:
        r = demo(remote, "train.max_steps=30", env={"DFLASH_FAULT": "drafter:3"})
    finally:
        kill_left(remote)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    run_id = launched(r.stderr)
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{run_id} crashed"), last
