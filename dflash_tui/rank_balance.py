"""processes mode: where each rank's loop time goes, and which rank the others wait for.

From each rank's heartbeat-rank{R}.json `stages_ms` (its loop thread's stage medians, ms
per iteration: one batch for a target rank, one step for a drafter rank) three sums:

- compute: the rank's own work (forward, backward, mask, optimizer);
- comm: time in sends, receives and the drafters' gradient all-reduce, or waiting on them
  (`wait q_hs`: a target's sends unfinished, a drafter's features not received;
  `transfer`: a target posting its sends; `wait replicas`: the all-reduce), which is also
  where a rank waits for a slower peer;
- other waits: its own queue from the data (`wait q_pre`), a GPU waiting for Python (`host`).

A straggler is a rank whose compute is well above its same-role peers' while the other
ranks spend their loop in comm: they wait for it. With no straggler, ranks of both roles
in comm more than the job computes is the link itself. Pure Python: the rules
(diagnosis/ranks.py), `status` and the ranks pane read the same numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trainer.contract.heartbeat import (
    STAGE_TRANSFER,
    STAGE_WAIT_HS,
    STAGE_WAIT_REPLICAS,
    is_wait,
)
from trainer.contract.phases import TRAINING
from trainer.contract.ranks import RankHeartbeat

COMM_STAGES = (STAGE_WAIT_HS, STAGE_TRANSFER, STAGE_WAIT_REPLICAS)


@dataclass(frozen=True)
class Split:
    """One rank's loop, ms per iteration."""

    compute_ms: float
    comm_ms: float
    other_wait_ms: float

    @property
    def loop_ms(self) -> float:
        return self.compute_ms + self.comm_ms + self.other_wait_ms

    @property
    def comm_share(self) -> float:
        return self.comm_ms / self.loop_ms if self.loop_ms > 0 else 0.0


def split(b: RankHeartbeat) -> Split | None:
    """None: its loop is not timed (not yet, or an older trainer)."""
    if not b.stages_ms:
        return None
    comm = sum(ms for st, ms in b.stages_ms.items() if st in COMM_STAGES)
    waits = sum(ms for st, ms in b.stages_ms.items() if st not in COMM_STAGES and is_wait(st))
    compute = sum(b.stages_ms.values()) - comm - waits
    return Split(compute_ms=max(0.0, compute), comm_ms=comm, other_wait_ms=waits)


@dataclass(frozen=True)
class Timed:
    beat: RankHeartbeat
    split: Split


def timed(beats: list[RankHeartbeat], stale: set[int], min_steps: int) -> list[Timed]:
    """The ranks whose loop numbers speak for now: training, no error of their own, not
    silent (`stale`: those whose heartbeat is behind), at least `min_steps` steps in (the
    medians' window filled past the first, slower loops)."""
    out = []
    for b in beats:
        sp = split(b)
        if sp is None or sp.loop_ms <= 0 or b.phase != TRAINING or b.error is not None:
            continue
        if b.rank in stale or b.step < min_steps:
            continue
        out.append(Timed(b, sp))
    return out


@dataclass(frozen=True)
class Straggler:
    who: Timed
    peers_ms: float  # the median compute of its same-role peers
    peers: int
    waiting: list[Timed]  # the other ranks that wait, most waiting first

    @property
    def factor(self) -> float:
        return self.who.split.compute_ms / self.peers_ms if self.peers_ms > 0 else float("inf")


def stragglers(
    ranks: list[Timed], factor: float, min_ms: float, wait_frac: float
) -> list[Straggler]:
    """Each rank with compute >= `factor` x its same-role peers' median (and `min_ms`
    above it) while at least half of the other ranks spend `wait_frac` of their loop in
    comm. Needs two ranks of its role: a rank alone has no peer to be slower than."""
    found = []
    for r in ranks:
        peers = [p for p in ranks if p.beat.role == r.beat.role and p is not r]
        if not peers:
            continue
        peers_ms = statistics.median(p.split.compute_ms for p in peers)
        mine = r.split.compute_ms
        if mine < factor * peers_ms or mine - peers_ms < min_ms:
            continue
        others = [o for o in ranks if o is not r]
        waiting = [o for o in others if o.split.comm_share >= wait_frac]
        if 2 * len(waiting) < len(others):
            continue
        waiting.sort(key=lambda o: -o.split.comm_share)
        found.append(Straggler(r, peers_ms, len(peers), waiting))
    return found


@dataclass(frozen=True)
class LinkBound:
    comm_ms: float  # summed over the ranks
    compute_ms: float
    heaviest: list[Timed]  # most comm first


def link_bound(ranks: list[Timed], wait_frac: float) -> LinkBound | None:
    """The job's ranks spend more of their loops in comm than in compute, and both roles
    wait (senders for room, receivers for features): neither side's work sets the pace."""
    roles = {r.beat.role for r in ranks}
    if len(roles) < 2:
        return None
    for role in roles:
        shares = [r.split.comm_share for r in ranks if r.beat.role == role]
        if statistics.median(shares) < wait_frac:
            return None
    comm = sum(r.split.comm_ms for r in ranks)
    compute = sum(r.split.compute_ms for r in ranks)
    if comm <= compute:
        return None
    heaviest = sorted(ranks, key=lambda r: -r.split.comm_ms)
    return LinkBound(comm, compute, heaviest)
