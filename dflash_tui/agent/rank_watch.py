"""The followed run's heartbeat-rank{R}.json files (a processes-mode job), each re-read when
it changes and checked with the contract's reader, like heartbeat.json (files.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from dflash_tui.agent.files import HeartbeatWatch
from trainer.contract.ranks import (
    MAX_RANK_HEARTBEAT_BYTES,
    MAX_RANKS,
    parse_rank_heartbeat,
    rank_of_heartbeat_name,
)

LIST_EVERY_S = 1.0  # new ranks appear as the job starts; listing the dir each tick costs


class RankWatch:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.watches: dict[int, HeartbeatWatch] = {}
        self._listed_at = -LIST_EVERY_S

    def _list(self) -> None:
        now = time.monotonic()
        if now - self._listed_at < LIST_EVERY_S:
            return
        self._listed_at = now
        try:
            names = os.listdir(self.run_dir)
        except OSError:
            return
        for name in names:
            rank = rank_of_heartbeat_name(name)
            if rank is None or len(self.watches) >= MAX_RANKS:
                continue
            if rank not in self.watches:
                path = os.path.join(self.run_dir, name)
                self.watches[rank] = HeartbeatWatch(
                    path, parse_rank_heartbeat, MAX_RANK_HEARTBEAT_BYTES
                )

    def poll(self) -> list[tuple[int, str, Any]]:
        """[(rank, "ok", the file as written) | (rank, "error", why)] for each that changed."""
        self._list()
        changed = []
        for rank in sorted(self.watches):
            got = self.watches[rank].poll()
            if got is not None:
                changed.append((rank, *got))
        return changed
