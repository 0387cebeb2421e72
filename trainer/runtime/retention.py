"""train.keep_checkpoints: which checkpoints a run keeps once a new one is on disk.

Kept: the newest N, the one whose step has the best held-out τ (eval/step-N.json, written by
trainer/evaluation/acceptance.py), those whose eval may still be running, and always the
resume point (the contract's
`choose_resume` over the sidecars: after a NaN the newest good one is older than the newest).
Everything else is removed, the .pt before its sidecar, so a crash between the two leaves a
sidecar without a checkpoint (ignored), never a checkpoint without its verdict. Runs on the
checkpoint writer's thread after a successful save; a failed save prunes nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainer.contract.checkpoints import (
    CHECKPOINTS,
    CheckpointMeta,
    choose_resume,
    meta_name,
    parse_meta,
    pt_name,
    step_of,
)
from trainer.contract.typed import Unreadable
from trainer.evaluation.acceptance import eval_path


def held_out_tau(run_dir: Path, step: int) -> float | None:
    """The run's own held-out τ at `step` (not an `eval --set` variant), or None."""
    try:
        record = json.loads(eval_path(run_dir, step).read_text())
    except (OSError, ValueError):
        return None
    tau = record.get("tau") if isinstance(record, dict) else None
    if record.get("held_out") is not True or not isinstance(tau, int | float):
        return None
    return float(tau) if math.isfinite(tau) else None


def newest_eval_step(run_dir: Path) -> int | None:
    """The step of the run's newest eval record, or None."""
    folder = eval_path(run_dir, 0).parent
    names = folder.glob("step-*.json") if folder.is_dir() else ()
    steps = [int(n.name[5:13]) for n in names if n.name[5:13].isdigit() and n.name[13:] == ".json"]
    return max(steps, default=None)


def to_keep(run_dir: Path, steps: list[int], keep: int, eval_every: int = 0) -> set[int]:
    """Of the checkpoints at `steps`, the ones `keep` (> 0) keeps. With `eval_every`, a
    checkpoint at an eval step newer than the newest eval record is kept too: its τ may
    still be being measured (an eval can outlast several checkpoints)."""
    folder = run_dir / CHECKPOINTS
    kept = set(sorted(steps)[-keep:])
    taus = {s: t for s in steps if (t := held_out_tau(run_dir, s)) is not None}
    if taus:
        kept.add(max(taus, key=lambda s: (taus[s], s)))
    if eval_every > 0:
        newest = newest_eval_step(run_dir)
        kept |= {s for s in steps if s % eval_every == 0 and (newest is None or s > newest)}
    sidecars: dict[int, CheckpointMeta | Unreadable | None] = {}
    for s in steps:
        side = folder / meta_name(s)
        try:
            sidecars[s] = parse_meta(side.read_bytes(), side.name)
        except OSError:
            sidecars[s] = None
    resume = choose_resume(sidecars)
    if resume.step is not None:
        kept.add(resume.step)
    return kept


def prune(run_dir: Path, keep: int, eval_every: int = 0) -> list[str]:
    """Remove the checkpoints `keep` does not keep (0: none); the names removed."""
    folder = run_dir / CHECKPOINTS
    if keep <= 0 or not folder.is_dir():
        return []
    steps = sorted(s for p in folder.iterdir() if (s := step_of(p.name)) is not None)
    removed = []
    for s in sorted(set(steps) - to_keep(run_dir, steps, keep, eval_every)):
        (folder / pt_name(s)).unlink(missing_ok=True)
        (folder / meta_name(s)).unlink(missing_ok=True)
        removed.append(pt_name(s))
    return removed
