"""`dflash-tui demo` in a real tmux at 160x48, as a user would start it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def test_demo_in_tmux_shows_gpus_phase_steps_queues_and_tau(tmp_path, dflash_cache_dir):
    session = f"dflash-test-{os.getpid()}"
    env = {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "DFLASH_CACHE_DIR": str(dflash_cache_dir),
        "TERM": "xterm-256color",
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # A fresh tmux server has sized its pane 80x24 for a moment now and then: start once the
    # pane has its 160x48.
    cmd = (
        f"sleep 1; cd {shlex.quote(str(ROOT))} && env {exports} {shlex.quote(sys.executable)} -m "
        "dflash_tui demo --set runtime.wandb_mode=disabled"
        # The random target and the shipped chats: this test is about the screen; the demo's
        # own target and data (trained on first use) are tested in test_online_eval.py.
        " --set target.path=builtin:tiny-qwen3 --set data.path=builtin:synthetic-chat; sleep 60"
    )  # keep the pane to read
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", cmd)
    try:
        deadline = time.monotonic() + 90
        screen = ""
        wanted = ("no NVIDIA GPU", "training", "tok/s", "step=", "q_hs", "drafter-1 ", "τ ")
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-t", session, "-p")
            if all(w in screen for w in wanted):
                break
            time.sleep(1)
        missing = [w for w in wanted if w not in screen]
        assert not missing, f"missing {missing} after 90 s:\n{screen}"
        assert len(screen.splitlines()[0]) <= 160
        # The stage bars: a row per pipeline thread, its loop's period and largest stage.
        rows = re.findall(r"│ ((?:prefetch|target|drafter)-\d) +cpu [█░▒]+ +[\d.]+ m?s  \w", screen)
        assert rows == [f"{r}-{i}" for r in ("prefetch", "target", "drafter") for i in (0, 1)], (
            screen
        )

        tmux("send-keys", "-t", session, "?")
        time.sleep(1)
        assert "dflash-tui keys" in tmux("capture-pane", "-t", session, "-p")
        tmux("send-keys", "-t", session, "q")  # closes help
        time.sleep(1)
        tmux("send-keys", "-t", session, "q")  # quits
        time.sleep(3)
        after = tmux("capture-pane", "-t", session, "-p")
        assert "the run goes on" in after  # q left the demo run alone, and said so
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        remote = tmp_path / "state" / "dflash-tui" / "demo"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dflash_tui",
                "kill",
                "local",
                "--remote-dir",
                str(remote),
                "--timeout",
                "10",
            ],
            capture_output=True,
            cwd=ROOT,
            timeout=60,
        )
