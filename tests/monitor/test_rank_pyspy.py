"""py-spy of a processes-mode job's ranks (dflash_tui/agent/rank_pyspy.py): a pid from a
rank's heartbeat file is attached to only when the kernel lists it as a child of the proven
launcher running the trainer. Real processes and the real py-spy: a launcher with a rank
child, and a forged rank file naming a process that is no child of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_tui.agent.identity import Proven
from dflash_tui.agent.procs import proc_group, proc_start
from dflash_tui.agent.rank_pyspy import launcher_children, pyspy_ranks
from dflash_tui.agent.rank_stacks import RankPlace
from trainer.contract.ranks import RANK_SCHEMA_VERSION, RankHeartbeat

# A launcher whose one child runs "the trainer" (its argv names it, as torchrun's ranks'
# `python -m trainer` does), and prints the child's pid once the child has exec'd: Popen
# returns after the fork, when /proc/KID/cmdline can still be the launcher's (under load the test
# then read a child that did not yet run the trainer).
LAUNCHER = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)',"
    " 'trainer'])\n"
    "deadline = time.monotonic() + 30\n"
    "while b'trainer' not in open(f'/proc/{kid.pid}/cmdline', 'rb').read().split(bytes(1))"
    " and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "print(kid.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def beat(rank: int, pid: int) -> RankHeartbeat:
    return RankHeartbeat(
        schema=RANK_SCHEMA_VERSION,
        run_id="job",
        rank=rank,
        world_size=2,
        role="target" if rank == 0 else "drafter",
        index=0,
        device="cpu",
        pid=pid,
        host="here",
        now=time.time(),
        phase="training",
    )


# The trainer extra installs py-spy beside the interpreter (scripts/test's .venv).
VENV_BIN = str(Path(sys.executable).parent)
HAVE_PYSPY = shutil.which("py-spy", path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")


@pytest.mark.skipif(HAVE_PYSPY is None, reason="py-spy is not installed")
def test_only_a_proven_child_of_the_launcher_is_attached_to(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    stranger = subprocess.Popen(["sleep", "60"])  # the test's child, not the launcher's
    rank_pid = 0
    try:
        assert launcher.stdout is not None
        rank_pid = int(launcher.stdout.readline())
        start, group = proc_start(launcher.pid), proc_group(launcher.pid)
        assert start is not None and group is not None
        proc = Proven(
            run_id="job", pid=launcher.pid, pgid=group, start=start, run_dir=str(tmp_path)
        )
        assert launcher_children(proc) == {rank_pid}
        places = [
            RankPlace(0, beat(0, rank_pid), None),
            RankPlace(1, beat(1, stranger.pid), None),  # a forged rank file's pid
        ]
        text = pyspy_ranks(proc, places, budget_s=30)
        first, second = text.split("\n## ")
        assert first.startswith(f"## rank 0 (target 0) pid {rank_pid}")
        assert "py-spy dump --native" in first and f"Process {rank_pid}" in first, first
        assert second.startswith(f"rank 1 (drafter 0) pid {stranger.pid}")
        assert f"not attached (pid {stranger.pid} is not a child of the launcher" in second
        assert f"Process {stranger.pid}" not in text
        assert stranger.poll() is None  # untouched
    finally:
        for p in (launcher, stranger):
            p.kill()
            p.wait()
        if rank_pid:  # the launcher's child, which its SIGKILL leaves behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank_pid, signal.SIGKILL)
