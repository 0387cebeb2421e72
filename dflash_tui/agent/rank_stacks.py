"""dump-stacks of a processes-mode job: every rank's stacks, each headed by its rank.

The agent signals only the proven run process, the launcher
(trainer/distributed/torchrun_job.py); it passes SIGUSR1/SIGUSR2 on to its own children that are
ranks (trainer/distributed/signals.py).
Each rank writes its dump into its own dir: the writer rank into the run dir, rank R into
ranks/rank-R/ (trainer/distributed/layout.py `rank_dir`). Which ranks there are, and what each is,
come from the heartbeat-rank{R}.json files, read through the contract (bounded, no symlink). Nothing
here signals a pid read from a file.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import stat
import time

from dflash_tui.agent.files import Refused, read_after, size_or_zero, tail_or_empty
from dflash_tui.agent.identity import Proven, signal_process, still
from trainer.contract.ranks import (
    MAX_RANKS,
    RankHeartbeat,
    rank_of_heartbeat_name,
    read_rank_heartbeat,
)
from trainer.contract.records import read_config

RANK_BYTES = 1 << 18  # of one rank's dump: a few KB of Python stacks, bounded anyway
RANK_WAIT_S = 4.0  # every rank's named dump (a loaded host with many ranks answers later)
RESEND_S = 0.8  # a SIGUSR1 swallowed by a native library: the rank's guard puts ours back
FALLBACK_FILE = "stacks-sigusr2.txt"  # trainer/runtime/signals.py: faulthandler's, appended to


@dataclasses.dataclass(frozen=True)
class RankPlace:
    rank: int
    beat: RankHeartbeat
    folder: str | None  # where the rank writes its dumps; None: not a plain dir

    @property
    def name(self) -> str:
        b = self.beat
        return f"rank {b.rank} ({b.role} {b.index}) pid {b.pid} on {b.host}, {b.device}"


def _plain_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)  # a symlinked dir is not followed
    except OSError:
        return False


def processes_mode(run_dir: str) -> bool:
    """The run's config.json says so: a stray heartbeat-rank file in a threads-mode run's
    dir does not make it a job of ranks."""
    cfg = read_config(run_dir)
    runtime = cfg.get("runtime") if isinstance(cfg, dict) else None
    return isinstance(runtime, dict) and runtime.get("mode") == "processes"


def rank_places(run_dir: str) -> list[RankPlace]:
    """The job's ranks, in rank order; [] for a threads-mode run."""
    if not processes_mode(run_dir):
        return []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    ranks = sorted({r for n in names if (r := rank_of_heartbeat_name(n)) is not None})
    places = []
    for rank in ranks[:MAX_RANKS]:
        beat = read_rank_heartbeat(run_dir, rank)
        if not isinstance(beat, RankHeartbeat) or beat.rank != rank:
            continue
        if beat.writer:
            folder: str | None = run_dir
        else:
            ranks_dir = os.path.join(run_dir, "ranks")
            own = os.path.join(ranks_dir, f"rank-{rank}")
            folder = own if _plain_dir(ranks_dir) and _plain_dir(own) else None
        places.append(RankPlace(rank, beat, folder))
    return places


def fresh_named_dump(
    folder: str, before: set[str], max_bytes: int = RANK_BYTES
) -> tuple[str, str] | None:
    """The newest stacks-<time>.txt in `folder` not in `before`, once written to its end."""
    try:
        fresh = sorted(
            n for n in os.listdir(folder) if n.startswith("stacks-2") and n not in before
        )
    except OSError:
        return None
    if fresh:
        text = tail_or_empty(folder, fresh[-1], max_bytes)
        if "# faulthandler" in text:  # the trainer writes it last
            return fresh[-1], text
    return None


def _listing(folder: str | None) -> set[str]:
    try:
        return set(os.listdir(folder)) if folder else set()
    except OSError:
        return set()


def dump_ranks(proc: Proven, places: list[RankPlace], timeout_s: float) -> tuple[str, str]:
    """(text, kind): every rank's named dump (SIGUSR1 to the launcher, once more after
    RESEND_S for ranks still silent), then faulthandler's (SIGUSR2) for any rank that gave
    none within RANK_WAIT_S; a rank that gave neither is named as silent."""
    t0 = time.monotonic()
    before = {p.rank: _listing(p.folder) for p in places}
    found: dict[int, tuple[str, str]] = {}
    signal_process(proc, signal.SIGUSR1)
    resent = False
    until = t0 + min(timeout_s, RANK_WAIT_S)
    waiting = [p for p in places if p.folder]
    while waiting and time.monotonic() < until:
        for p in list(waiting):
            got = fresh_named_dump(p.folder or "", before[p.rank])
            if got is not None:
                found[p.rank] = got
                waiting.remove(p)
        if waiting and not resent and time.monotonic() - t0 >= RESEND_S and still(proc):
            signal_process(proc, signal.SIGUSR1)
            resent = True
        time.sleep(0.05)
    fallback: dict[int, str] = {}
    if waiting and still(proc):
        # Where each silent rank's faulthandler file ends now: what SIGUSR2 appends is after.
        offsets = {p.rank: size_or_zero(p.folder or "", FALLBACK_FILE) for p in waiting}
        signal_process(proc, signal.SIGUSR2)
        time.sleep(1.0)  # faulthandler writes from the C handler at once
        for p in waiting:
            try:
                text, _ = read_after(p.folder or "", FALLBACK_FILE, offsets[p.rank], RANK_BYTES)
            except (OSError, Refused):
                text = ""
            if text:
                fallback[p.rank] = text
    out = [f"# processes-mode job: {len(places)} ranks; launcher pid {proc.pid}\n"]
    for p in places:
        if p.rank in found:
            name, text = found[p.rank]
            out.append(f"## {p.name}: {name}\n{text}")
        elif p.rank in fallback:
            out.append(
                f"## {p.name}: no named dump within {RANK_WAIT_S:.0f}s (busy or stuck in C "
                f"code?): faulthandler's C-level dump\n{fallback[p.rank]}"
            )
        elif p.folder is None:
            out.append(
                f"## {p.name}: its dir ranks/rank-{p.rank} is not a plain directory: not read\n"
            )
        else:
            out.append(
                f"## {p.name}: no dump at all within {RANK_WAIT_S:.0f}s (exited, or stopped?)\n"
            )
    kind = "ranks" if len(found) == len(places) else "ranks-partial"
    return "\n".join(out), kind
