"""A processes-mode job's ranks as the monitor holds and says them: each rank's newest
heartbeat-rank{R}.json (the agent's `rank_heartbeat` events, parsed here with the contract's
reader), its lag behind the freshest rank, and the lines and JSON the views print.

A rank of another host has no file on this one: the writer's heartbeat.json relays it
(`ranks`, trainer/distributed/rank_relay.py), read entry by entry with the contract's
`relayed_ranks`. A rank's own file, where this monitor reads one, wins over its relay."""

from __future__ import annotations

import dataclasses
from typing import Any

from dflash_tui import rank_balance
from dflash_tui.fmt import count, rate
from trainer.contract.phases import FINAL_PHASES
from trainer.contract.protocol import RankHeartbeatEvent
from trainer.contract.ranks import MAX_RANKS, RankHeartbeat, parse_rank_heartbeat, relayed_ranks
from trainer.contract.typed import Unreadable


@dataclasses.dataclass
class RankSeen:
    beat: RankHeartbeat | None = None
    error: str | None = None  # why its file was last unreadable (the last good one stays)
    # Known through the writer's heartbeat.json only (a rank of another host), and when its
    # beat reached the writer, on the writer's clock: the clock its lag is counted on.
    relayed: bool = False
    received: float = 0.0


def fold(ranks: dict[int, RankSeen], e: RankHeartbeatEvent) -> Unreadable | None:
    """Fold one event into `ranks`; an unreadable file is returned to be counted."""
    if e.rank not in ranks and len(ranks) >= MAX_RANKS:
        return Unreadable(f"heartbeat-rank{e.rank}.json", "more ranks than a monitor holds")
    seen = ranks.setdefault(e.rank, RankSeen())
    if e.error is not None:
        seen.error = e.error
        return None
    beat = parse_rank_heartbeat(e.data, f"heartbeat-rank{e.rank}.json")
    if isinstance(beat, Unreadable):
        seen.error = beat.why
        return beat
    if beat.rank != e.rank:
        seen.error = f"says it is rank {beat.rank}"
        return Unreadable(f"heartbeat-rank{e.rank}.json", seen.error)
    seen.beat, seen.error, seen.relayed = beat, None, False
    return None


def fold_relayed(ranks: dict[int, RankSeen], relayed: Any) -> list[Unreadable]:
    """Fold a writer's heartbeat.json `ranks` into `ranks`; the unreadable entries are
    returned to be counted, each once until its reason changes."""
    bad = []
    for rank, got in relayed_ranks(relayed).items():
        seen = ranks.get(rank)
        if seen is not None and not seen.relayed:
            continue  # its own file is read here: fresher, and whole
        if seen is None:
            if len(ranks) >= MAX_RANKS:
                bad.append(Unreadable(f"heartbeat.json ranks[{rank}]", "more ranks than held"))
                continue
            seen = ranks[rank] = RankSeen(relayed=True)
        if isinstance(got, Unreadable):
            if seen.error != got.why:
                bad.append(got)
            seen.error = got.why
            continue
        (seen.received, seen.beat), seen.error = got, None
    return bad


def beats(ranks: dict[int, RankSeen]) -> list[RankHeartbeat]:
    return [seen.beat for _, seen in sorted(ranks.items()) if seen.beat is not None]


def lags(ranks: dict[int, RankSeen]) -> dict[int, float]:
    """Seconds each rank's newest heartbeat is behind the freshest rank's (the ranks' own
    clocks, so no clock of the monitor's enters; ranks of one host share one clock, and a
    relayed rank counts by when it reached the writer, on that same host's clock)."""
    at = {
        rank: seen.received if seen.relayed else seen.beat.now
        for rank, seen in ranks.items()
        if seen.beat is not None
    }
    if not at:
        return {}
    newest = max(at.values())
    return {rank: max(0.0, newest - t) for rank, t in sorted(at.items())}


def name(b: RankHeartbeat) -> str:
    return f"rank {b.rank} ({b.role} {b.index})"


def lines(ranks: dict[int, RankSeen]) -> list[str]:
    """One line per rank for `status` (host text: the caller sanitises)."""
    behind = lags(ranks)
    out = []
    for rank, seen in sorted(ranks.items()):
        b = seen.beat
        if b is None:
            out.append(f"rank {rank}: unreadable ({seen.error})")
            continue
        lag = behind.get(rank, 0.0)
        text = f"{name(b)} pid {b.pid} on {b.host}, {b.device}: {b.phase}, step {count(b.step)}"
        if (work := loop_text(b)) is not None:
            text += f", {work}"
        if lag >= 1.0 and b.phase not in FINAL_PHASES:
            text += f", heartbeat {lag:.0f}s behind the others"
        if seen.relayed:
            text += ", relayed by the writer"
        if b.error is not None:
            text += f"; error: {b.error.message}"
        if seen.error:
            text += f" (its {'relay' if seen.relayed else 'file'} now: {seen.error})"
        out.append(text)
    return out


def loop_text(b: RankHeartbeat) -> str | None:
    """`1.8K tok/s, 430 ms compute + 40 ms comm per step`; None while not timed."""
    sp = rank_balance.split(b)
    if sp is None:
        return None
    per = "step" if b.role == "drafter" else "batch"
    text = f"{rate(b.tok_s)}, {sp.compute_ms:.0f} ms compute + {sp.comm_ms:.0f} ms comm"
    if sp.other_wait_ms >= 0.5:
        text += f" + {sp.other_wait_ms:.0f} ms other waits"
    return f"{text} per {per}"


def to_json(ranks: dict[int, RankSeen]) -> list[dict[str, Any]]:
    behind = lags(ranks)
    return [
        {
            "rank": rank,
            "heartbeat": seen.beat.to_json() if seen.beat else None,
            "lag_s": behind.get(rank),
            "error": seen.error,
            "relayed": seen.relayed,  # through the writer's heartbeat.json, not its own file
        }
        for rank, seen in sorted(ranks.items())
    ]
