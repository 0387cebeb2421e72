"""processes mode: a rank outlives no launcher.

torchrun's agent is every rank's parent. When it dies without stopping them (SIGKILL, the
OOM killer, a SIGUSR1 it had no handler for), its ranks are re-parented and train on,
holding their GPUs, with nobody left to reap them or record the job's exit: orphans. Each
rank watches its parent: once the parent is not the one it started under, the rank stops
as at a SIGTERM (the current step, the writer's checkpoint, exit).

A thread that polls getppid() rather than PR_SET_PDEATHSIG: the death signal fires when
the parent *thread* that forked the child exits, which need not be the agent's end.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

WATCH_PERIOD_S = 1.0


def watch_launcher(
    on_gone: Callable[[str], None], period_s: float = WATCH_PERIOD_S
) -> threading.Thread:
    """A daemon thread that calls `on_gone(why)` once, when this process's parent changes."""
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                on_gone(f"the launcher (torchrun, pid {parent}) is gone")
                return

    th = threading.Thread(target=loop, name="launcher-watch", daemon=True)
    th.start()
    return th
