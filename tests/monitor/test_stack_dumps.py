"""`dflash-tui dump-stacks` on a real (CPU) trainer, as an operator runs it, in the two ways a
live GPU run defeated it: a native library that took SIGUSR1 at the C level (Triton's LLVM,
DFLASH_FAULT=steal_signals), and a main thread stuck in C code (DFLASH_FAULT=wedge_main),
where only the C-level faulthandler dump can come, its threads named from the heartbeat."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from monitor_helpers import ROOT

# Named dumps have 2 s before the C-level fallback: not beside another test's trainer.
pytestmark = pytest.mark.serial

LONG = ("--max-steps", "100000", "--set", "train.log_every=1")


def dump_stacks(root: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    where = ["local", "--run-root", str(root), "--remote-dir", str(tmp_path / "remote")]
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "dump-stacks", *where, "--no-pyspy"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    return r, time.monotonic() - t0


def test_named_dumps_keep_coming_after_a_library_takes_sigusr1(start_trainer, tmp_path):
    p = start_trainer(*LONG, env={"DFLASH_FAULT": "steal_signals:2"})
    p.wait_step(4)
    for _ in range(5):
        r, seconds = dump_stacks(p.run_root, tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert 'Thread "drafter-0" role=drafter@cpu' in r.stdout
        assert "C-level dump" not in r.stdout
        assert seconds < 2.0 + 1.5, seconds  # the dump's 2 s, and the CLI's own start


def test_a_main_thread_stuck_in_c_gets_the_faulthandler_dump_with_names(start_trainer, tmp_path):
    p = start_trainer(*LONG, env={"DFLASH_FAULT": "wedge_main:2"})
    p.wait_step(4)
    time.sleep(0.5)  # the main thread checks the fault every 0.2 s
    r, seconds = dump_stacks(p.run_root, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "no named dump within 2s" in out and "faulthandler's C-level dump" in out
    # faulthandler's pthread ids, named and given their roles from the heartbeat.
    assert '"drafter-0" role=drafter@cpu' in out and '"target-0" role=target@cpu' in out
    assert '"MainThread" role=main@cpu' in out
    assert "supervise" in out  # where the main thread is stuck: the fault's frame
    assert seconds < 10, seconds
    print(out[:1500])
    # Training goes on while the main thread is stuck (the pipeline's threads do the work).
    step = p.heartbeat()["step"]
    p.wait_step(step + 2)
