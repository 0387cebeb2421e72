"""`dflash-tui status --run-dir PATH`: one run dir diagnosed after the fact, as an operator
asks "what went wrong here?" of a run dir copied off the box. The run dirs are the ones the
previous main's trainer and agent wrote for real (tests/fixtures/rundirs/main-c119aa7, its
README says how); the real CLI and a real local agent read them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED, STOPPED = "20261201-031405-tiny-cpu-6e92", "20261201-031436-tiny-cpu-b507"
CRASHED, BAD_SET = "20261201-031510-tiny-cpu-ca8a", "20261201-031600-tiny-cpu-32b0"


def status(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "status", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    return r, time.monotonic() - t0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four run dirs side by side, as copied off a host (newest last: 32b0)."""
    root = tmp_path_factory.mktemp("copied") / "runs"
    shutil.copytree(RECORDED, root, ignore=shutil.ignore_patterns("README.md"))
    return root


@pytest.mark.parametrize(
    ("run", "code", "words"),
    [
        (FINISHED, 0, ["finished", "step 40"]),
        (STOPPED, 0, ["stopped", "step 51"]),
        (CRASHED, 2, ["crashed", "InjectedFault: injected fault in drafter at item 15"]),
        (BAD_SET, 2, ["exited before its first step", "train.lr: expected a number"]),
    ],
)
def test_each_run_dir_gets_its_own_diagnosis_not_the_latest_runs(runs, run, code, words):
    r, seconds = status("--run-dir", str(runs / run))
    assert r.returncode == code, r.stdout + r.stderr
    for w in words:
        assert w in r.stdout, r.stdout
    assert "Traceback" not in r.stderr
    # A run that never wrote a heartbeat used to hold `status` for its whole 15 s settle
    # timeout; the others are as quick (the local agent starts in ~0.5 s here).
    assert seconds < 8, seconds


def test_a_relative_path_and_a_trailing_slash_name_the_same_run(runs):
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "status", "--run-dir", f"runs/{CRASHED}/"],
        capture_output=True, text=True, timeout=60, cwd=runs.parent,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 2 and "InjectedFault" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--run-dir", "/nonexistent/run"], "--run-dir /nonexistent/run: no such directory"),
        (["--run-dir", str(RECORDED)], "not a run dir (none of heartbeat.json"),
        (["--run-dir", f"{RECORDED}/{FINISHED}", "--run-root", "/x"], "leave out --run-root"),
        (["--run-dir", "/"], "name the run dir itself"),
    ],
)
def test_a_bad_run_dir_is_one_clear_line_and_exit_2(args, needle):
    r, _ = status(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
