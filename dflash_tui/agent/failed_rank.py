"""exit.json's failed_rank: the job heartbeat's failed_rank, told by that rank's own heartbeat."""

from __future__ import annotations

from pathlib import Path

from trainer.contract.heartbeat import Heartbeat
from trainer.contract.ranks import RankHeartbeat, read_rank_heartbeat
from trainer.contract.records import FailedRank


def failed_rank_of(run_dir: str | Path, hb: Heartbeat | None) -> FailedRank | None:
    """None: nothing failed, or a threads-mode run (no failed_rank in its heartbeat)."""
    if hb is None or hb.failed_rank is None:
        return None
    beat = read_rank_heartbeat(run_dir, hb.failed_rank)
    if not isinstance(beat, RankHeartbeat):  # its file is gone or torn: the number is still known
        return FailedRank(rank=hb.failed_rank)
    error = beat.error.message if beat.error else ""
    return FailedRank(beat.rank, beat.role, beat.index, beat.host, error)
