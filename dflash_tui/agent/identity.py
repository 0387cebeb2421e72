"""Whose process a signal may reach: the one identity rule every signal of the agent obeys.

A run's files name its process by pid, process group and start time (`proc_start`, recorded
at launch by the wrapper, and by the heartbeat of schema 2). A pid alone names nothing: once
the run ends the kernel hands the number to the next process. So before any signal (kill,
restart, dump stacks, py-spy, and every TUI key or row action: they are all agent commands)
`prove` shows, once per command (or thread-table sample), that the recorded process is still
the run's:

- it lives, on this host, and started at the tick recorded for the run;
- it is still in the recorded process group;
- for a launched run (launch.json is there), it leads that group (the wrapper starts the
  trainer so) and holds the run root's launch lock itself:
  one of its descriptors is open on RUN_ROOT/.launch.lock and holds the flock, the lock the
  agent took at launch and handed down;
- for a run started by hand (no launch.json), it, or its parent in the same group (a
  processes-mode job's heartbeat names the writer rank, its torchrun launcher holds the
  lock), holds that lock: `python -m trainer` takes it itself
  (trainer/runtime/launch_lock.py). Without this, a heartbeat forged to name any process
  (its pid, start time and group are all readable from /proc) got that stranger killed.

A run dir with no start time recorded (schema 1, an older trainer) proves nothing: refused,
never guessed. Any other process a signal reaches must be a member of that process group,
looked at while a proven member still lives in it (`Group`): the kernel gives a group's
number to no other process while any member lives.

What `prove` returns, `Proven`, is all the rest of the command needs of the run: its dir (as
the command checked it, `RunRoot.checked_dir`: computed once per command), its pid, start
time and group. A kill, a restart and a dump of stacks each prove once, then pass it on
(kill.py, rank_stacks.py, rank_pyspy.py); each signal after that goes only to that process
(`signal_process`, re-checked by `still`) or its group (`Group`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import time

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.procs import (
    group_members,
    group_pids,
    holder_in_line,
    holds_flock,
    pid_alive,
    proc_group,
    proc_start,
    ticks_to_s,
)
from dflash_tui.agent.runs import Process, RunRoot, newest_checkpoint, read_process
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.outcomes import outcome_of
from trainer.contract.records import HEARTBEAT, ExitRecord, read_exit


class NotRunning(CommandError):
    """Nothing of the run lives any more (it ended, or its pid is another process's now):
    there is nothing of it to signal. A restart goes on to launch."""


@dataclasses.dataclass(frozen=True)
class Proven:
    """A run, proven just now: its process (pid, its start time, its group) and its dir."""

    run_id: str
    pid: int
    pgid: int
    start: int
    run_dir: str  # RunRoot.checked_dir(run_id), as the command that proved it checked it


def _span(seconds: float) -> str:
    s = abs(seconds)
    if s < 90:
        return f"{s:.0f}s"
    if s < 90 * 60:
        return f"{s / 60:.0f}m"
    if s < 48 * 3600:
        return f"{s / 3600:.0f}h"
    return f"{s / 86400:.0f}d"


def _reused(pid: int, recorded: int, now: int) -> str:
    delta = ticks_to_s(now - recorded)
    if delta > 0:
        return f"pid {pid} is another process now (started {_span(delta)} after the run)"
    # Within one boot a pid cannot name, later, a process that started before the recorded
    # one while that one still lived: the clock of ticks has restarted.
    return (
        f"pid {pid} is another process now (started {_span(delta)} before the run's recorded "
        "start: the host has restarted since)"
    )


def _ended(d: str) -> str | None:
    """When and how the run in `d` ended ("ended 3h ago (stopped at step 40)") when it has
    an exit record (written once the trainer has exited); else None."""
    ended = read_exit(d)
    if ended is None:
        return None
    if not isinstance(ended, ExitRecord):
        return "ended (its exit.json is unreadable)"
    hb = read_heartbeat(os.path.join(d, HEARTBEAT))
    hb = hb if isinstance(hb, Heartbeat) else None
    summary = outcome_of(False, hb, ended, newest_checkpoint(d)).summary
    ago = f" {_span(time.time() - ended.ended_at)} ago" if ended.ended_at else ""
    return f"ended{ago} ({summary})"


def _left_behind(proc: Process) -> str:
    """Processes still in the recorded group of a leader that is gone: said, never signalled
    (with its leader gone, nothing proves that group number still names the run's group)."""
    if not proc.pgid or proc.pgid <= 1:
        return ""
    pids = group_pids(proc.pgid)
    if not pids:
        return ""
    return (
        f" (pids {pids} are in its process group {proc.pgid}, not proven to be the run's: "
        "check them by hand)"
    )


def _unproven(runs: RunRoot, proc: Process) -> tuple[bool, str] | None:
    """None when `proc` is proven to be the run's; else (gone, why): `gone` when nothing of
    the run lives (it cannot be signalled), not gone when it cannot be proven either way."""
    pid = proc.pid
    if not proc.here:
        return False, (
            f"it was recorded on host {proc.host}, not on this one ({socket.gethostname()}): "
            f"pid {pid} names nothing of it here"
        )
    if pid is None or pid <= 0:
        return False, "no process of it is recorded (yet: still starting?)"
    if not pid_alive(pid):
        return True, f"pid {pid} has exited{_left_behind(proc)}"
    if proc.start is None:
        older = " (heartbeat schema 1: an older trainer)" if proc.schema == 1 else ""
        return False, (
            f"no start time is recorded for pid {pid}{older}, so pid {pid} cannot be proven "
            f"to be the run (check `ps -o pid,lstart,args -p {pid}`)"
        )
    now = proc_start(pid)
    if now is None:
        return True, f"pid {pid} has exited{_left_behind(proc)}"
    if now != proc.start:
        return True, _reused(pid, proc.start, now)
    group = proc_group(pid)
    if group != proc.pgid:
        return False, f"pid {pid} has left process group {proc.pgid} (it is in {group})"
    lock = runs.lock_path()
    if proc.launched:
        if pid != proc.pgid:  # the wrapper starts the trainer as its group's leader
            return False, f"pid {pid} is not the leader of its recorded group {proc.pgid}"
        held: bool | int | None = holds_flock(pid, lock)
        whose = "a launched run holds for its whole life"
    else:
        held = group is not None and holder_in_line(pid, group, lock)
        whose = "a run started by hand (python -m trainer) holds for its whole life"
    if held is None:
        return False, f"pid {pid}'s descriptors cannot be read (another user's process?)"
    if held is False:
        return False, f"pid {pid} does not hold {lock}, which {whose}"
    return None


def prove(runs: RunRoot, run_id: str, run_dir: str) -> Proven:
    """The run, proven (see the module's rule); else NotRunning when nothing of the run
    lives, or CommandError when it cannot be proven. Nothing is signalled here. `run_dir` is
    `runs.checked_dir(run_id)`, which the caller has just computed: a real folder directly
    under the run root, never a symlink."""
    proc = read_process(run_dir)
    why = _unproven(runs, proc)
    if why is None:
        assert proc.pid is not None and proc.pgid is not None and proc.start is not None
        return Proven(run_id, proc.pid, proc.pgid, proc.start, run_dir)
    gone, text = why
    ended = _ended(run_dir)
    if ended is not None:
        # exit.json is written once the trainer has exited: a live pid is someone else's.
        raise NotRunning(f"run {run_id} {ended}; {text}: not signalled")
    if gone:
        raise NotRunning(f"run {run_id} is not running; {text}: not signalled")
    raise CommandError(f"run {run_id}: {text}: not signalled")


def still(proven: Proven) -> bool:
    """Whether the proven process is still it (checked again just before acting on it)."""
    return pid_alive(proven.pid, proven.start)


def signal_process(proven: Proven, sig: int) -> None:
    """`sig` to the proven process itself, never to whatever has its pid now: through a
    pidfd, checked against the start time after opening it (the pidfd names one process for
    good). NotRunning when it is gone."""
    gone = NotRunning(
        f"run {proven.run_id} is not running; pid {proven.pid} has exited: not signalled"
    )
    try:
        pidfd: int | None = os.pidfd_open(proven.pid)
    except ProcessLookupError:
        raise gone from None
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): check, then signal
        pidfd = None
    try:
        if not still(proven):
            raise gone
        if pidfd is None:
            os.kill(proven.pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        raise gone from None
    finally:
        if pidfd is not None:
            os.close(pidfd)


class Group:
    """The proven process's group. Its members are the processes in that group while one
    already known to be the run's lives in it (the proven process first, then every member
    seen beside it): a group whose known members are all gone is no longer the run's, and
    is neither listed nor signalled."""

    def __init__(self, proven: Proven) -> None:
        self.pgid = proven.pgid
        self.known = {(proven.pid, proven.start)}

    def members(self) -> list[int]:
        now = group_members(self.pgid)
        if not any(m in self.known for m in now):
            return []
        self.known.update(now)
        return [pid for pid, _start in now]

    def signal(self, sig: int) -> list[int]:
        """`sig` to the group, when it is still the run's -> the members it went to."""
        pids = self.members()
        if pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
        return pids
