"""bench/SCALING.md's tables are what bench/scaling.py computes from the configs, the model
code and the recorded measurements: the doc cannot drift from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scaling_doc_matches_the_calculator() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scaling.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
