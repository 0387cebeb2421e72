"""processes mode: which rank failed first, read from the ranks' heartbeat-rank{R}.json.

When one rank fails, the others fail soon after with the engine's errors (gloo: "Connection
closed by peer", a timeout), which name an address, not a rank. So a failing rank reads the
others' heartbeats: the cause is a rank whose final heartbeat carries an error of its own
(not a lost peer), or one whose process ended without a final heartbeat (SIGKILL, the OOM
killer). A rank still running is waited for, briefly.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from trainer.contract.heartbeat import ErrorInfo
from trainer.contract.ranks import RankHeartbeat, read_rank_heartbeat

# What the engine says when a peer is gone or silent: a consequence, not a cause.
PEER_LOSS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out",
    "timed out",
    "Timeout",
    "DistBackendError",
    "NCCL communicator was aborted",
)


def is_peer_loss(message: str) -> bool:
    return any(p in message for p in PEER_LOSS)


@dataclass
class Blame:
    rank: int
    why: str  # one line: what that rank is, and what happened to it


def _alive(beat: RankHeartbeat) -> bool | None:
    """Whether the rank's process still exists; None: on another host, cannot tell."""
    if beat.host != socket.gethostname():
        return None
    try:
        os.kill(beat.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _what(beat: RankHeartbeat) -> str:
    return f"rank {beat.rank} ({beat.role} {beat.index} on {beat.device})"


def find_failed_rank(
    run_dir: Path,
    world_size: int,
    me: int,
    my_error: ErrorInfo | None,
    wait_s: float = 3.0,
    settle_s: float = 0.5,
) -> Blame | None:
    """The rank that failed first; None when none can be found within `wait_s`. Once one
    cause is found, ranks still running are waited for only `settle_s` (another cause
    may be earlier): every rank waits here before it exits, and a peer's exit is what
    ends the next rank's wait."""
    if my_error is not None and not is_peer_loss(my_error.message):
        return Blame(me, f"rank {me}: {my_error.message}")
    start = time.monotonic()
    deadline = start + wait_s
    while True:
        causes: list[tuple[float, int, str]] = []
        unsettled = False
        for r in range(world_size):
            if r == me:
                continue
            beat = read_rank_heartbeat(run_dir, r)
            if not isinstance(beat, RankHeartbeat):
                unsettled = True
                continue
            blames_another = beat.failed_rank is not None and beat.failed_rank != r
            if beat.final:
                if blames_another:  # it found the cause elsewhere: a consequence
                    continue
                if beat.error is not None and not is_peer_loss(beat.error.message):
                    causes.append((beat.now, r, f"{_what(beat)}: {beat.error.message}"))
            elif _alive(beat) is False:
                why = (
                    f"{_what(beat)}: its process (pid {beat.pid}) ended without a final"
                    f" heartbeat at step {beat.step} (killed: SIGKILL, the OOM killer?)"
                )
                causes.append((beat.now, r, why))
            else:
                unsettled = True
        if causes and (not unsettled or time.monotonic() >= start + settle_s):
            _, rank, why = min(causes)
            return Blame(rank, why)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
