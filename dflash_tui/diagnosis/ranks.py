"""Rules of processes mode's ranks: a silent or failed rank, a straggler, a slow link."""

from __future__ import annotations

from dflash_tui import rank_balance, ranks_view
from dflash_tui.diagnosis.common import (
    dur,
    live_heartbeat,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    HEARTBEAT_MAX_INTERVAL_S,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.fmt import count
from dflash_tui.state import Store
from trainer.contract.phases import (
    FINAL_PHASES,
    TRAINING,
)


@rule(
    Code("rank_silent", ("critical",), "processes mode: one rank's heartbeat fell behind"),
    reads="every rank's heartbeat-rank file (processes mode)",
    decides="With two ranks or more and the job not in a final phase: a rank, not in a final "
    "phase itself, whose heartbeat is more than `stale_factor` × 2 s behind the freshest "
    "rank's. That process is hung or dead while the job's heartbeat, written by another "
    "rank, still looks fresh.",
    thresholds=("stale_factor",),
    action="dump stacks (d): its section says where it waits; if nothing answers, kill (K) "
    "and restart (r)",
)
def rank_silent(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """processes mode: one rank's heartbeat falls behind the other ranks' (each rewrites its
    own every <= 2 s from its own thread): that process is hung or dead while the job's
    heartbeat, written by another rank, still looks fresh."""
    hb = s.heartbeat
    if hb is None or hb.phase in FINAL_PHASES or len(s.ranks) < 2:
        return []
    limit = cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S
    by_rank = {b.rank: b for b in ranks_view.beats(s.ranks)}
    found = []
    for rank, lag in ranks_view.lags(s.ranks).items():
        b = by_rank[rank]
        if lag <= limit or b.phase in FINAL_PHASES:
            continue
        found.append(
            Finding(
                "critical",
                "rank_silent",
                f"{ranks_view.name(b)} silent on {b.host}",
                f"its heartbeat is {dur(lag)} behind the freshest rank's (pid {b.pid}, "
                f"{b.device}, last phase {b.phase} at step {count(b.step)}); each rank rewrites it "
                "every <= 2 s",
                "dump stacks (d): its section says where it waits; if it answers nothing, "
                "kill (K) and restart (r)",
            )
        )
    return found


@rule(
    Code("rank_failed", ("critical",), "processes mode: a rank says it failed"),
    reads="every rank's heartbeat-rank file: its error and failed_rank",
    decides="The job not in a final phase, and a rank's heartbeat carries an error with "
    "failed_rank unset or naming that rank (a rank stopped because another failed is not "
    "blamed). Said before the job's end: the other ranks stop within seconds.",
    action="read that rank's train.log (ranks/rank-R/ for all but the writer), fix, then "
    "restart (r) from the last checkpoint",
)
def rank_failed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """processes mode: a rank says it failed, before the job's end names it (the other
    ranks stop within seconds, then exit.json and `crashed` say the rest)."""
    hb = s.heartbeat
    if hb is None or hb.phase in FINAL_PHASES:
        return []
    return [
        Finding(
            "critical",
            "rank_failed",
            f"{ranks_view.name(b)} failed on {b.host}",
            f"{b.error.message} (rank {b.rank}, pid {b.pid}, {b.device}, step {count(b.step)})",
            "the job stops within seconds; read its log ("
            + ("train.log" if b.writer else f"ranks/rank-{b.rank}/train.log")
            + "), fix, then restart (r) from the last checkpoint",
        )
        for b in ranks_view.beats(s.ranks)
        if b.error is not None and b.failed_rank in (None, b.rank)
    ]


def _timed_ranks(s: Store, now: float, cfg: DiagnosisConfig) -> list[rank_balance.Timed]:
    """Every rank's loop times (rank_balance.timed) while the job trains; none while any
    rank's do not speak (silent, failed, unreadable, not training yet): the others wait for
    that one, which rank_silent and rank_failed name, not a straggler or the link."""
    if live_heartbeat(s, now, cfg, TRAINING) is None or len(s.ranks) < 2:
        return []
    limit = cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S
    stale = {r for r, lag in ranks_view.lags(s.ranks).items() if lag > limit}
    ranks = rank_balance.timed(ranks_view.beats(s.ranks), stale, cfg.rank_min_steps)
    return ranks if len(ranks) == len(s.ranks) else []


def _stragglers(s: Store, now: float, cfg: DiagnosisConfig) -> list[rank_balance.Straggler]:
    return rank_balance.stragglers(
        _timed_ranks(s, now, cfg), cfg.straggler_factor, cfg.straggler_min_ms, cfg.rank_wait_frac
    )


def _waiters(ranks: list[rank_balance.Timed], most: int = 3) -> str:
    return ", ".join(
        f"{ranks_view.name(r.beat)} {r.split.comm_share:.0%} ({r.split.comm_ms:.0f} ms)"
        for r in ranks[:most]
    ) + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


def rank_marks(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> dict[int, str]:
    """{rank: failed | silent | straggler} by the rules' own tests, for the ranks pane."""
    marks = {r.beat.rank: "straggler" for r in (st.who for st in _stragglers(s, now, cfg))}
    limit = cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S
    lags = ranks_view.lags(s.ranks)
    for b in ranks_view.beats(s.ranks):
        if not s.ended() and b.phase not in FINAL_PHASES and lags.get(b.rank, 0.0) > limit:
            marks[b.rank] = "silent"
        if b.error is not None and b.failed_rank in (None, b.rank):
            marks[b.rank] = "failed"
    return marks


@rule(
    Code(
        "rank_straggler",
        ("warning",),
        "processes mode: one rank computes slower than its peers and the others wait for it",
    ),
    reads="every rank's loop stage times (heartbeat-rank's stages_ms, rank_balance.py), while "
    "the job trains",
    decides="Only when every rank's times speak: training, no error, not more than "
    "`stale_factor` × 2 s behind, at least `rank_min_steps` steps in. A rank whose compute "
    "per loop is at least `straggler_factor` × the median of its same-role peers' and "
    "`straggler_min_ms` above it, while at least half of the other ranks spend "
    "`rank_wait_frac` or more of their loop in sends, receives and the all-reduce.",
    thresholds=(
        "stale_factor",
        "rank_min_steps",
        "straggler_factor",
        "straggler_min_ms",
        "rank_wait_frac",
    ),
    action="check that device on that host (its clocks and throttling, other processes on "
    "it); a device that stays slow: restart the job without it",
)
def rank_straggler(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """processes mode: one rank computes each batch well slower than its same-role peers
    while the ranks it feeds, or is fed by, wait in their sends, receives and all-reduce:
    the whole job runs at that rank's pace."""
    found = []
    for st in _stragglers(s, now, cfg):
        b, sp = st.who.beat, st.who.split
        work = ", ".join(
            f"{name} {ms:.0f}"
            for name, ms in sorted(b.stages_ms.items(), key=lambda kv: -kv[1])
            if name not in rank_balance.COMM_STAGES and not name.startswith("wait")
        )
        peers = (
            f"the median of its {st.peers} {b.role} peers'"
            if st.peers > 1
            else f"its {b.role} peer's"
        )
        per = "step" if b.role == "drafter" else "batch"
        found.append(
            Finding(
                "warning",
                "rank_straggler",
                f"{ranks_view.name(b)} is a straggler on {b.host}, {b.device}",
                f"{sp.compute_ms:.0f} ms of compute per {per} ({work} ms) vs "
                f"{st.peers_ms:.0f} ms, {peers} "
                f"({st.factor:.1f}x); the others wait in sends, receives and the all-reduce: "
                f"{_waiters(st.waiting)} of their loops",
                f"check {b.device} on {b.host} (its clocks and throttling, other processes on "
                "it); a device that stays slow: restart the job without it",
            )
        )
    return found


@rule(
    Code("slow_link", ("warning",), "processes mode: the ranks wait on the link between them"),
    reads="every rank's loop stage times (rank_balance.py), as for rank_straggler",
    decides="The ranks' times speak (as for rank_straggler) and no rank is a straggler; both "
    "roles' median share of the loop in sends, receives and the all-reduce is at least "
    "`rank_wait_frac`, and the ranks' summed comm time exceeds their summed compute.",
    thresholds=(
        "stale_factor",
        "rank_min_steps",
        "straggler_factor",
        "straggler_min_ms",
        "rank_wait_frac",
    ),
    action="check the transport the ranks use (NCCL_DEBUG=INFO names it in each rank's log): "
    "a socket or PCIe path where NVLink or InfiniBand was expected",
)
def slow_link(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """processes mode: the ranks of both roles spend more of their loops in sends, receives
    and the all-reduce than in compute, and no straggler is to blame: the link between the
    ranks (the transport, its bandwidth) sets the job's pace."""
    ranks = _timed_ranks(s, now, cfg)
    if _stragglers(s, now, cfg):
        return []
    bound = rank_balance.link_bound(ranks, cfg.rank_wait_frac)
    if bound is None:
        return []
    return [
        Finding(
            "warning",
            "slow_link",
            "the ranks wait on the link between them",
            f"{len(ranks)} ranks spend {bound.comm_ms:.0f} ms per loop in sends, receives and "
            f"the all-reduce, and compute {bound.compute_ms:.0f} ms, with no straggler; "
            f"heaviest waiters: {_waiters(bound.heaviest)} of their loops",
            "check the transport the ranks use (NCCL_DEBUG=INFO names it in each rank's "
            "log): a socket or PCIe path where NVLink or InfiniBand was expected",
        )
    ]
