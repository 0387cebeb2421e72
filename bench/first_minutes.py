"""A new user's first minutes (issue 32): `scripts/demo` on a fresh clone, to the first
training step, cold (an empty cache and state: the first demo after the venv exists) and
warm (the same clone again).

    .venv/bin/python bench/first_minutes.py [--repo .] [--runs 1] [--json]

A fresh `git clone` of the repo's committed HEAD into a temp dir; its .venv is a new venv that
reads this checkout's venv's packages through a .pth file (the charter's "after the venv
exists": torch and the rest are not downloaded again; nothing is installed into the venv it
reads), and `scripts/setup` run once untimed installs the clone into it. Then, timed:
`scripts/demo --headless` with a fresh DFLASH_CACHE_DIR and XDG_STATE_HOME (cold), and once
more (warm), each from the command to the first step line it prints (`train.log_every=1`,
so that is step 1); the run is left to finish (`train.max_steps=5`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

STEP_LINE = re.compile(r"\bstep[= ]\s*1\b")
DEMO_ARGS = ["--headless", "--set", "train.log_every=1", "--set", "train.max_steps=5"]


def make_clone(repo: Path, where: Path) -> Path:
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", "--no-local", str(repo), str(clone)], check=True)
    venv = clone / ".venv"
    # No pip or setuptools of its own: this venv's, read through the .pth, install the clone.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = sysconfig.get_paths()["purelib"]  # this venv's packages, read, never written
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "reuse-packages.pth").write_text(ours + "\n")
    return clone


def time_to_first_step(clone: Path, env: dict[str, str], timeout: float = 900) -> float:
    """Seconds from `scripts/demo` to its first step line; the run is waited out."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["scripts/demo", *DEMO_ARGS],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    first: float | None = None
    for line in proc.stdout:
        if first is None and "step" in line and STEP_LINE.search(line):
            first = time.monotonic() - t0
        if os.environ.get("BENCH_VERBOSE"):
            print(f"  {time.monotonic() - t0:6.1f}s {line.rstrip()}", file=sys.stderr)
    code = proc.wait(timeout)
    if first is None:
        raise SystemExit(f"no step line from scripts/demo (exit {code})")
    return first


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    p.add_argument("--runs", type=int, default=1, help="cold+warm pairs, each a fresh clone")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="first-minutes-") as tmp:
            where = Path(tmp)
            clone = make_clone(args.repo, where)
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            env.update(
                DFLASH_CACHE_DIR=str(where / "cache"),
                XDG_STATE_HOME=str(where / "state"),
                XDG_CONFIG_HOME=str(where / "config"),
                NO_COLOR="1",
            )
            env.pop("DFLASH_PREBUILT_DIR", None)  # the clone's own prebuilt/, as a user's
            # Untimed: the venv exists. Its build backend is the reused venv's setuptools.
            subprocess.run(
                ["scripts/setup", "trainer"],
                check=True,
                cwd=clone,
                env={**env, "PIP_NO_BUILD_ISOLATION": "0"},
            )
            cold = time_to_first_step(clone, env)
            warm = time_to_first_step(clone, env)
            results.append({"cold_s": round(cold, 1), "warm_s": round(warm, 1)})
            shutil.rmtree(where / "cache", ignore_errors=True)
    summary = {
        "cpus": len(os.sched_getaffinity(0)),
        "load_1m": round(os.getloadavg()[0], 2),
        "runs": results,
    }
    print(json.dumps(summary) if args.json else summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
