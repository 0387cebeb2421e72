"""`export`: the trainer's own `python -m trainer export` run on the host, from the deployed
release, into `<remote dir>/exports/<run id>-step-<N>-<dtype>`: the drafter as SpecForge and
SGLang load it (trainer/evaluation/export.py). The step is the run's newest good checkpoint by the
contract's rule (agent/resume.py) unless one is named; the trainer refuses an existing
folder, so an export is never overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.launch import release_dir
from dflash_tui.agent.resume import Checkpoints
from trainer.contract.protocol import ExportDrafter

EXPORTS = "exports"
DTYPES = ("bfloat16", "float32")


def export(
    remote_dir: str, python: str | None, run_id: str, run_dir: str, cmd: ExportDrafter
) -> dict[str, Any]:
    """`run_dir`: the run's, as the command checked it (`RunRoot.checked_dir`)."""
    if cmd.dtype not in DTYPES:
        raise CommandError(f"dtype {cmd.dtype!r}: one of {', '.join(DTYPES)}", bad_input=True)
    step = cmd.step
    if step is None:
        choice = Checkpoints().choice(run_dir)
        if choice.step is None:
            why = "; ".join(f"{n}: {w}" for n, w in choice.skipped) or "it has none"
            raise CommandError(
                f"run {run_id}: no good checkpoint to export ({why})", bad_input=True
            )
        step = choice.step
    elif step < 0:
        raise CommandError(f"step {step}: a checkpoint's step is not negative", bad_input=True)
    release = release_dir(remote_dir)
    folder = os.path.join(remote_dir, EXPORTS)
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, f"{run_id}-step-{step}-{cmd.dtype}")
    if os.path.lexists(out):  # not bad input: the export was made before (exit 1)
        raise CommandError(f"{out}: already exists; an export never overwrites")
    python = python or os.path.abspath(sys.executable)
    argv = [python, "-m", "trainer", "export", run_dir, "--out", out, "--step", str(step),
            "--dtype", cmd.dtype]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = release + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        r = subprocess.run(
            argv, check=False, cwd=release, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, errors="replace", timeout=cmd.timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise CommandError(
            f"export of {run_id} step {step} took over {cmd.timeout_s:.0f}s"
        ) from None
    except OSError as e:
        raise CommandError(f"could not start {python}: {e.strerror or e}") from None
    said = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode != 0:
        err = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        # The trainer exits 2 for bad input (no checkpoint at that step), 1 for a failure.
        raise CommandError(
            f"export of {run_id} step {step}: {err.removeprefix('error: ')}",
            bad_input=r.returncode == 2,
        )
    return {"run_id": run_id, "step": step, "out": out, "dtype": cmd.dtype, "said": said}
