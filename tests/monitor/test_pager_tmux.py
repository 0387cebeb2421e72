"""`o` in a real terminal (tmux): the app steps aside for $PAGER, which gets the log the
store holds, sanitised, and the dashboard comes back when the pager exits."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def wait(what: str, ok, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(f"no {what} after {timeout:.0f} s")


def test_o_hands_the_log_sanitised_to_the_pager_and_comes_back(tmp_path):
    seen, done = tmp_path / "seen.log", tmp_path / "pager-exited"
    # The pager: copies the file it is given and exits, as `q` in less would.
    pager = f"sh -c 'cp \"$0\" {shlex.quote(str(seen))}; touch {shlex.quote(str(done))}'"
    hostile = "step=9 \x1b[2J\x1b]0;owned\x07 end of the line"
    session = f"dflash-pager-{os.getpid()}"
    env = {"PAGER": pager, "XDG_CONFIG_HOME": str(tmp_path / "config"), "TERM": "xterm-256color"}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = (
        f"sleep 1; env {exports} {shlex.quote(sys.executable)} "
        f"{shlex.quote(str(HERE / 'scripted_tui.py'))} {shlex.quote(hostile)}; sleep 30"
    )
    tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd)
    try:
        wait("dashboard", lambda: "? help" in tmux("capture-pane", "-t", session, "-p"))
        tmux("send-keys", "-t", session, "o")
        wait("pager", done.exists)
        text = seen.read_text()
        assert "+479m" not in text and "[479m] step=876 loss=" in text  # the log as written
        assert "\x1b" not in text and "\x07" not in text
        assert text.splitlines()[-1] == r"step=9 \x1b[2J\x1b]0;owned\x07 end of the line"
        assert len(text.splitlines()) == 41
        wait("dashboard back", lambda: "Step log" in tmux("capture-pane", "-t", session, "-p"))
        tmux("send-keys", "-t", session, "q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
