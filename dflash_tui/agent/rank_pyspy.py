"""py-spy's native view of a processes-mode job's ranks, each rank proven before attaching.

A rank's pid comes from its heartbeat-rank{R}.json, which anyone who can write the run dir
could forge. So a pid is attached to only when the kernel lists it, right now, as a child of
the launcher `identity.prove` proved just before (torchrun's agent starts every rank itself),
and the child's argv runs the trainer. A pid that fails either is named and skipped.
"""

from __future__ import annotations

import os
import subprocess
import time

from dflash_tui.agent.identity import Proven, still
from dflash_tui.agent.procs import proc_start
from dflash_tui.agent.rank_stacks import RankPlace

PYSPY_TIMEOUT_S = 20.0  # one rank's attach and dump; a whole job is bounded by the caller


def launcher_children(proc: Proven) -> set[int]:
    """The proven launcher's live children, as the kernel lists them."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{proc.pid}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{proc.pid}/task/{task}/children") as f:
                kids.update(int(k) for k in f.read().split())
        except (OSError, ValueError):
            continue
    return kids


def _runs_the_trainer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"trainer" in argv


def pyspy_ranks(proc: Proven, places: list[RankPlace], budget_s: float) -> str:
    """One section per rank: py-spy's dump of it, or why it was not attached to."""
    out: list[str] = []
    until = time.monotonic() + budget_s
    for place in places:
        pid = place.beat.pid
        kids = launcher_children(proc) if still(proc) else set()
        if pid not in kids or not _runs_the_trainer(pid):
            out.append(
                f"## {place.name}: not attached (pid {pid} is not a child of the launcher, "
                f"pid {proc.pid}, running the trainer)\n"
            )
            continue
        if time.monotonic() >= until:
            out.append(f"## {place.name}: not attached (the {budget_s:.0f}s budget is spent)\n")
            continue
        start = proc_start(pid)
        try:
            r = subprocess.run(
                ["py-spy", "dump", "--native", "--pid", str(pid)],
                check=False,
                capture_output=True,
                text=True,
                timeout=PYSPY_TIMEOUT_S,
            )
            text = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            text = f"py-spy did not answer within {PYSPY_TIMEOUT_S:.0f}s\n"
        if proc_start(pid) != start:  # the pid ended and was reused while attached
            text = "the rank ended while py-spy read it: its dump is not shown\n"
        out.append(f"## {place.name}: py-spy dump --native\n{text}")
    return "\n".join(out)
