"""Stopping a run: SIGTERM to its process group, SIGKILL after a timeout, then waiting until
its GPU memory is released (the next run needs it), and reading the exit record and how the
run ended (its outcome: where it stopped, what a restart resumes from). It is given the run
as the command proved it (`identity.Proven`: its dir and process) and signals that group
only (`identity.Group`); it proves nothing again and computes no path of the run again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from dflash_tui.agent.gpus import Gpus
from dflash_tui.agent.identity import Group, Proven
from dflash_tui.agent.runs import RunRoot, newest_checkpoint
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.outcomes import outcome_of
from trainer.contract.protocol import GpuProcess
from trainer.contract.records import HEARTBEAT, ExitRecord, read_exit

GpuEntries = dict[tuple[int, int], GpuProcess]  # (GPU index, pid) -> its process entry


def gpu_entries(gpus: Gpus) -> GpuEntries | None:
    if gpus.backend == "none":
        return None
    try:
        devices = gpus.sample()
    except Exception:
        return None
    return {(d.index, p.pid): p for d in devices for p in d.processes}


def kill(
    runs: RunRoot,
    gpus: Gpus,
    proven: Proven,
    timeout: float,
    drain_timeout: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Stop the proven run (identity.prove, by the caller, just before)."""
    group = Group(proven)
    before = gpu_entries(gpus)
    t0 = time.monotonic()
    used = "SIGTERM"
    pids = group.signal(signal.SIGTERM)
    if pids:
        progress(f"SIGTERM to process group {group.pgid} (pids {pids})")
        next_note = 5.0
        while group.members() and time.monotonic() - t0 < timeout:
            if time.monotonic() - t0 > next_note:
                progress(
                    f"waiting for a clean exit: {time.monotonic() - t0:.0f}s of {timeout:.0f}s"
                )
                next_note += 5.0
            time.sleep(0.1)
        if group.members():
            used = "SIGKILL"
            progress(f"still alive after {timeout:.0f}s: SIGKILL")
            group.signal(signal.SIGKILL)
            end = time.monotonic() + 10
            while group.members() and time.monotonic() < end:
                time.sleep(0.05)
    stop_s = time.monotonic() - t0
    orphans = group.members()
    drain_s, held = wait_drain(gpus, pids, before, drain_timeout, progress)
    # The wrapper records the exit; give it a moment.
    run_dir = proven.run_dir
    end = time.monotonic() + 5
    while read_exit(run_dir) is None and time.monotonic() < end:
        time.sleep(0.05)
    ended = read_exit(run_dir)
    exit_record = ended if isinstance(ended, ExitRecord) else None
    hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    outcome = outcome_of(
        False,
        hb if isinstance(hb, Heartbeat) else None,
        exit_record,
        newest_checkpoint(run_dir),
        resume=runs.resume_point(proven.run_id, run_dir),
    )
    drained = "" if drain_s is None else f", GPU memory released after {drain_s:.1f}s"
    progress(f"stopped in {stop_s:.1f}s{drained}")
    return {
        "run_id": proven.run_id,
        "signal": used,
        "pids": pids,
        "stop_s": stop_s,
        "drain_s": drain_s,
        "gpu_held_by": held,
        "orphans": orphans,
        "exit": exit_record,
        "outcome": outcome,
    }


def wait_drain(
    gpus: Gpus,
    pids: list[int],
    before: GpuEntries | None,
    timeout: float,
    progress: Callable[[str], None],
) -> tuple[float | None, list[int]]:
    """Wait until the killed processes' GPU memory is released -> (seconds, still held)."""
    if before is None:
        return None, []
    t0 = time.monotonic()
    ours = set(pids)
    # Entries we cannot map (host pids seen from a container) count as ours if they
    # were there at kill time: wait for them to go too.
    watch = {k for k, p in before.items() if k[1] in ours or not p.local}
    next_note = 2.0
    while True:
        now_entries = gpu_entries(gpus) or {}
        held = sorted({k[1] for k in watch if k in now_entries})
        if not held:
            return time.monotonic() - t0, []
        if time.monotonic() - t0 > timeout:
            return None, held
        if time.monotonic() - t0 > next_note:
            progress(f"GPU memory still held by pids {held}")
            next_note += 2.0
        time.sleep(0.1)
