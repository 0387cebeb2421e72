"""The tiny CPU config learns: loss falls clearly, accuracy and acceptance rise far above chance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_cpu_learns(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--config",
            str(ROOT / "trainer" / "configs" / "tiny-cpu.toml"),
            "--run-root",
            str(tmp_path),
            "--max-steps",
            "150",
            "--set",
            "train.log_every=25",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]  # not the launch lock
    m = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = m[0], m[-1]
    assert last["step"] == 150
    vocab = 448  # chance accuracy is ~1/vocab
    assert first["acc"] < 0.15
    assert last["loss"] < 0.7 * first["loss"], (first, last)
    assert last["acc"] > 0.25 > 50 / vocab
    # Acceptance length: 1.0 means no draft token accepted; well above it means real drafts.
    assert last["streak"] > 2.5
