"""processes mode: the stack-dump signals, passed from torchrun's launcher to its ranks.

`dflash-tui dump-stacks` signals the one process it can prove is the run: the launcher
(trainer/distributed/torchrun_job.py, torchrun's agent in-process). torchrun handles SIGTERM and
SIGINT (it stops its ranks) but not SIGUSR1 or SIGUSR2, whose default action ends the process: the
launcher died and left its ranks as orphans. Here the launcher takes both and passes each
on to its own children that are ranks of this trainer; each rank writes its named stacks
(SIGUSR1) or faulthandler's (SIGUSR2) into its own dir, where the agent collects them
(dflash_tui/agent/rank_stacks.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import FrameType

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)


def rank_children() -> list[int]:
    """This process's live children that run the trainer (torchrun's workers), from /proc:
    only pids the kernel lists as ours, so nothing else is ever signalled."""
    kids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    ranks = []
    for kid in sorted(set(kids)):
        try:
            argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if b"trainer" in argv:  # `python -m trainer ...`, as torchrun was told to start
            ranks.append(kid)
    return ranks


def forward_to_ranks(signum: int, _frame: FrameType | None) -> None:
    """The signal handler: `signum` passed on to each child running the trainer."""
    for kid in rank_children():
        with contextlib.suppress(ProcessLookupError):  # ended between listing and signal
            os.kill(kid, signum)


def install_forwarding() -> None:
    for sig in FORWARDED:
        signal.signal(sig, forward_to_ranks)
