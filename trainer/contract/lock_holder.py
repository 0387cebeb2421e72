"""Whether a process holds a flock itself, from /proc: the agent's proof that a pid is a
run's (the run root's launch lock, records.LAUNCH_LOCK) and the trainer's check that the lock
the agent's launch handed down is already its own (runtime/launch_lock.py).

Linux only; stdlib only, as all of the contract.
"""

from __future__ import annotations

import os


def holds_flock(pid: int | str, path: str | os.PathLike[str]) -> bool | None:
    """Whether the process holds the flock on `path` itself: one of its descriptors is open on
    that file and its open file description holds the lock (the `lock:` line the kernel shows
    in /proc/PID/fdinfo/FD for that description only). None when its descriptors cannot be
    read (another user's process). `pid` may be "self"."""
    try:
        target = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")  # the open file itself
        except OSError:
            continue
        if (st.st_dev, st.st_ino) != (target.st_dev, target.st_ino):
            continue
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
                info = f.read(65536).decode("ascii", "replace")
        except OSError:
            continue
        if any(line.startswith("lock:") and " FLOCK " in line for line in info.splitlines()):
            return True
    return False
