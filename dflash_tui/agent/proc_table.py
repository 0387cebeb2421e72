"""The followed run's processes for the thread/process table: every process in the run's
proven process group (the trainer, its compile and tokenizer workers), from /proc; and the
launch wrapper beside them (launch.json's `wrapper_pid`, the trainer's parent), which lives in
a group of its own: shown, never signalled from the table.

Only the group `identity.prove` proved for the run just now is listed: a pid outside it is
never reported, so the table cannot offer to signal it (and the agent refuses it anyway:
`signal_member`). CPU use is over the time since the previous sample, per process (a
process seen for the first time has none yet).
"""

from __future__ import annotations

import os
import signal
import time

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.identity import Group, prove
from dflash_tui.agent.procs import command_of, pid_alive, proc_group
from dflash_tui.agent.runs import RunRoot
from trainer.contract.protocol import (
    MAX_PROC_NAME,
    MAX_PROCS,
    PROCESS_SIGNALS,
    ProcInfo,
    ProcsEvent,
)
from trainer.contract.records import LaunchRecord, read_launch

FIRST_INTERVAL_S = 0.5  # a new run's first sample reads twice, this far apart
# Indexes into /proc/PID/stat's fields after the command name (field 3 is index 0).
_STATE, _PPID, _PGRP, _UTIME, _STIME, _THREADS, _START, _RSS = 0, 1, 2, 11, 12, 17, 19, 21


def _fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    return data.rsplit(b")", 1)[-1].decode("ascii", "replace").split()


def _name(pid: int) -> str:
    """Its command line (what tells a compile worker from the trainer), cut; else its comm."""
    return command_of(pid, MAX_PROC_NAME)


class ProcTable:
    """Samples one run's group; remembers CPU ticks by (pid, start) for the next sample."""

    def __init__(self, runs: RunRoot) -> None:
        self.runs = runs
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        self._ticks: dict[tuple[int, int], tuple[int, float]] = {}  # -> (cpu ticks, at)

    def sample(self, run_id: str) -> ProcsEvent:
        try:
            proven = prove(self.runs, run_id, self.runs.checked_dir(run_id))
        except CommandError as e:  # ended, or not proven: nothing of it is listed
            self._ticks.clear()
            return ProcsEvent(run_id=run_id, note=str(e).removesuffix(": not signalled"))
        group = Group(proven)
        wrapper_pid = self._wrapper_pid(proven.run_dir)
        if not self._ticks:  # a run's first sample: its CPU use over a short interval
            self._ticks = self._read_all(proven.pgid, group.members(), wrapper_pid)[2]
            time.sleep(FIRST_INTERVAL_S)
        procs, wrapper, self._ticks = self._read_all(proven.pgid, group.members(), wrapper_pid)
        leader = next((p for p in procs if p.pid == proven.pid), None)
        if wrapper is not None and (leader is None or leader.ppid != wrapper.pid):
            wrapper = None  # not the trainer's parent: not the run's wrapper
        return ProcsEvent(
            run_id=run_id, pgid=proven.pgid, leader=proven.pid, procs=procs, wrapper=wrapper
        )

    def _wrapper_pid(self, run_dir: str) -> int | None:
        """The launch wrapper's pid as launch.json records it (a run started by hand has none)."""
        launch = read_launch(run_dir)
        return launch.wrapper_pid if isinstance(launch, LaunchRecord) else None

    def _read_all(
        self, pgid: int, pids: list[int], wrapper_pid: int | None
    ) -> tuple[list[ProcInfo], ProcInfo | None, dict[tuple[int, int], tuple[int, float]]]:
        seen: dict[tuple[int, int], tuple[int, float]] = {}
        procs = self._read(pgid, pids, seen)
        wrapper = self._read(None, [wrapper_pid], seen) if wrapper_pid else []
        return procs, (wrapper[0] if wrapper else None), seen

    def read_group(self, pgid: int, pids: list[int]) -> list[ProcInfo]:
        """One sample of `pids` in group `pgid`, CPU use since the previous one."""
        seen: dict[tuple[int, int], tuple[int, float]] = {}
        procs = self._read(pgid, pids, seen)
        self._ticks = seen
        return procs

    def _read(
        self, pgid: int | None, pids: list[int], seen: dict[tuple[int, int], tuple[int, float]]
    ) -> list[ProcInfo]:
        """What /proc says of each of `pids` still in group `pgid` (None: any group), at most
        MAX_PROCS; CPU use against the previous sample's ticks, this one's put in `seen`."""
        now = time.monotonic()
        procs = []
        for pid in pids[:MAX_PROCS]:
            f = _fields(pid)
            if f is None or len(f) <= _RSS or (pgid is not None and int(f[_PGRP]) != pgid):
                continue  # gone since the listing, or left the group
            key = (pid, int(f[_START]))
            ticks = int(f[_UTIME]) + int(f[_STIME])
            seen[key] = (ticks, now)
            before = self._ticks.get(key)
            cpu = None
            if before is not None and now > before[1]:
                busy_s = (ticks - before[0]) / self.tick
                cpu = round(max(0.0, 100.0 * busy_s / (now - before[1])), 1)
            procs.append(
                ProcInfo(
                    pid=pid,
                    start=key[1],
                    ppid=int(f[_PPID]),
                    state=f[_STATE][:1],
                    name=_name(pid),
                    cpu_pct=cpu,
                    rss=max(0, int(f[_RSS])) * self.page,
                    threads=int(f[_THREADS]),
                )
            )
        return procs


def signal_member(runs: RunRoot, run_id: str, pid: int, start: int, sig_name: str) -> str:
    """`sig_name` to one process of the run's group, after the identity rule: the run is
    proven (identity.prove), and `pid` lives, started at `start`, in the proven group. The
    signal goes through a pidfd opened before the last check, so it reaches that process or
    none. -> what was done; CommandError (one line) when refused."""
    if sig_name not in PROCESS_SIGNALS:
        raise CommandError(
            f"signal {sig_name[:20]!r}: not one a row may send ({', '.join(PROCESS_SIGNALS)})",
            bad_input=True,
        )
    proven = prove(runs, run_id, runs.checked_dir(run_id))  # refuses, signalling nothing
    refused = f"pid {pid}: not signalled"
    if pid <= 1:
        raise CommandError(f"{refused}: not a process of run {run_id}")
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        raise CommandError(f"{refused}: it has exited") from None
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): check, then signal
        pidfd = None
    try:
        if not pid_alive(pid, start):
            raise CommandError(f"{refused}: it has exited (or the pid is another process now)")
        group = proc_group(pid)
        if group != proven.pgid or pid not in Group(proven).members():
            raise CommandError(
                f"{refused}: it is in process group {group}, not run {run_id}'s ({proven.pgid})"
            )
        sig = signal.Signals[sig_name]
        if pidfd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        raise CommandError(f"{refused}: it has exited") from None
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return f"{sig_name} sent to pid {pid} (process group {proven.pgid} of run {run_id})"
