"""The run root's launch lock, held by a trainer started by hand as by a launched one.

The agent's launch flocks RUN_ROOT/.launch.lock and hands the descriptor down (wrapper, then
trainer); the agent signals only a process proven to hold it (dflash_tui/agent/identity.py).
A trainer started by hand (`python -m trainer --run-dir D`) takes the same lock itself, so
it is proven the same way, and a heartbeat forged to name another process (any pid, start
time and group are readable from /proc) proves nothing: that process holds no lock.

One run per run root, as for a launch: a second trainer while one lives there is refused in
one line. A launched trainer already holds the lock through the descriptor it inherited:
it is found among its own descriptors, and nothing more is taken.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from pathlib import Path

from trainer.config import ConfigError, show_path
from trainer.contract.lock_holder import holds_flock
from trainer.contract.records import ACTIVE, LAUNCH_LOCK, write_json_atomic

# A liveness probe of an agent holds the lock for microseconds, once a second: tries this
# far apart tell it from a run (the agent's launch tries as long).
TRIES = 25
PAUSE_S = 0.02
_PLAIN = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def _holder(run_root: Path) -> str:
    """The run .active.json names, for the refusal ("?" when it does not say)."""
    try:
        fd = os.open(run_root / ACTIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "?"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "?"
        data = json.loads(os.read(fd, 65536) or b"null")
    except (OSError, ValueError, RecursionError):
        return "?"
    finally:
        os.close(fd)
    run_id = data.get("run_id") if isinstance(data, dict) else None
    # Printed to a terminal: a plain run id only (another writer may have put anything there).
    return run_id if isinstance(run_id, str) and _PLAIN.fullmatch(run_id) else "?"


def hold(run_root: Path, named: str = "--run-root") -> int | None:
    """Hold RUN_ROOT/.launch.lock for the life of this process -> its descriptor (inheritable:
    processes mode execs torchrun, which keeps it), or None when it is held already (a
    launched trainer). ConfigError, one line, when another run holds it or the lock is no
    regular file; a run root that cannot be made is said as NAMED (the flag that gave it)."""
    lock = run_root / LAUNCH_LOCK
    where = show_path(lock)
    if holds_flock("self", lock):  # the lock the agent's launch handed down
        return None
    try:
        run_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{named} {show_path(run_root)}: {e.strerror or e}") from None
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{where}: a symlink: refused, not followed") from None
        raise ConfigError(f"{where}: cannot open it ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{where}: not a regular file: refused")
    for attempt in range(TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt + 1 == TRIES:
                os.close(fd)
                raise ConfigError(
                    f"{show_path(run_root)}: run {_holder(run_root)} is alive there (it "
                    f"holds {LAUNCH_LOCK}): one run per run root; stop it or use another"
                ) from None
            time.sleep(PAUSE_S)
    os.set_inheritable(fd, True)
    name_active(run_root, None)  # never the last launched run's name: it is not this one
    return fd


def name_active(run_root: Path, run_id: str | None) -> None:
    """.active.json names the run holding the lock (the agent's liveness reads it)."""
    write_json_atomic(str(run_root / ACTIVE), {"run_id": run_id, "wrapper_pid": None})
