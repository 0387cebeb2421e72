"""What /proc says about a process: whether it lives, when it started, its process group,
whether it holds a lock.

A pid alone does not name a process: once it exits, the kernel hands the number to the next
one. The start time (field 22 of /proc/PID/stat, in clock ticks since boot) does not repeat
for a pid, so the pair names the process; run records keep it as `proc_start`.
"""

from __future__ import annotations

import os
import pwd

from trainer.contract.lock_holder import holds_flock

# Indexes into the fields after the command name in /proc/PID/stat (field 3 is index 0).
_STATE = 0  # field 3: R, S, D, Z, ...
_PPID = 1  # field 4
_PGRP = 2  # field 5
_START = 19  # field 22: start time, clock ticks after boot


def _stat(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    return data.rsplit(b")", 1)[1].decode("ascii", "replace").split()


def _have_proc() -> bool:
    return os.path.exists("/proc/self/stat")


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks; None when it is gone or there is no /proc."""
    fields = _stat(pid)
    return int(fields[_START]) if fields is not None else None


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether `pid` is a live process (a zombie is dead) and, when `start` is given, the
    same process that started then: a reused pid is not it."""
    if pid is None or pid <= 0:  # kill(0) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists; another user's
    fields = _stat(pid)
    if fields is None:
        # Gone between the two calls, or a system without /proc, where the signal is all
        # there is to go on.
        return not _have_proc()
    if fields[_STATE] == "Z":
        return False
    return start is None or int(fields[_START]) == start


def proc_group(pid: int) -> int | None:
    """The process group of a live (non-zombie) process; None when it is gone."""
    fields = _stat(pid)
    return int(fields[_PGRP]) if fields is not None and fields[_STATE] != "Z" else None


def holder_in_line(pid: int, pgid: int, path: str, depth: int = 8) -> int | bool | None:
    """The process, `pid` or one of its ancestors in its own process group `pgid` (at most
    `depth` up), that holds the flock on `path` itself -> its pid; False when none does;
    None when one's descriptors cannot be read. A trainer started by hand holds the launch
    lock itself; in processes mode its torchrun launcher does, and the job's heartbeat
    names the writer rank, the launcher's child."""
    for _ in range(depth):
        held = holds_flock(pid, path)
        if held is None or held:
            return pid if held else None
        fields = _stat(pid)
        if fields is None:
            return False
        parent = int(fields[_PPID])
        if parent <= 1 or proc_group(parent) != pgid:
            return False
        pid = parent
    return False


def group_members(pgid: int) -> list[tuple[int, int]]:
    """(pid, start) of the live (non-zombie) processes in process group `pgid`, by pid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is not None and fields[_STATE] != "Z" and int(fields[_PGRP]) == pgid:
            out.append((int(entry), int(fields[_START])))
    return sorted(out)


def group_pids(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group `pgid`."""
    return [pid for pid, _start in group_members(pgid)]


def user_of(pid: int) -> str:
    """The name of the process's real user (its uid when the host has no name for it); ""
    when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read(8192).decode("ascii", "replace")
    except OSError:
        return ""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return ""


def command_of(pid: int, limit: int) -> str:
    """Its command line, words joined by spaces and cut to `limit` characters; else its
    comm (a kernel thread, a process whose cmdline is empty); "" when it is gone."""
    for path, sep in ((f"/proc/{pid}/cmdline", b"\0"), (f"/proc/{pid}/comm", b"\n")):
        try:
            with open(path, "rb") as f:
                raw = f.read(4 * limit)
        except OSError:
            continue
        words = [w for w in raw.split(sep) if w]
        if words:
            return b" ".join(words).decode("utf-8", "replace")[:limit]
    return ""


def ticks_to_s(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")
