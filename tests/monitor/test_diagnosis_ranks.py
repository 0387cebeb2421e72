"""rank_straggler and slow_link on rank heartbeats recorded from real processes-mode jobs
(tests/fixtures/ranks/: a straggler and a slow link injected with DFLASH_FAULT): firing,
and not firing just below their thresholds. Edits of a recorded rank are named in each test."""

from __future__ import annotations

import dataclasses
from typing import Any

from rank_fixtures import Beats, now_of, rank_store

from dflash_tui import rank_balance, ranks_view
from dflash_tui.diagnosis import DEFAULT_CONFIG, DiagnosisConfig, Finding, diagnose
from dflash_tui.state import Store

RANK_CODES = {"rank_straggler", "slow_link", "rank_silent", "rank_failed"}


def found(name: str, *edits: Any, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    return [
        f for f in diagnose(rank_store(name, *edits), now_of(name), cfg) if f.code in RANK_CODES
    ]


def one(findings: list[Finding], code: str) -> Finding:
    hits = [f for f in findings if f.code == code]
    assert len(hits) == 1, [(f.code, f.title) for f in findings]
    return hits[0]


def timed(s: Store) -> dict[int, rank_balance.Timed]:
    ranks = rank_balance.timed(ranks_view.beats(s.ranks), set(), DEFAULT_CONFIG.rank_min_steps)
    return {r.beat.rank: r for r in ranks}


def test_a_healthy_job_has_no_straggler_and_no_slow_link() -> None:
    assert found("healthy") == []
    ranks = timed(rank_store("healthy"))
    assert sorted(ranks) == [0, 1, 2, 3]  # every rank timed: the rules had numbers to read


def test_a_slowed_drafter_rank_is_named_the_straggler() -> None:
    """DFLASH_FAULT=slow:drafter:0.4:rank=3: its forward takes 400 ms longer."""
    f = one(found("slow-drafter"), "rank_straggler")
    beat = rank_store("slow-drafter").ranks[3].beat
    assert beat is not None
    assert f.severity == "warning"
    assert f.title == f"rank 3 (drafter 1) is a straggler on {beat.host}, cpu"
    assert "ms of compute per step (forward " in f.evidence
    assert "ms, its drafter peer's (" in f.evidence
    assert "rank 0 (target 0)" in f.evidence  # a rank it is fed by waits for it
    assert f"check cpu on {beat.host}" in f.action
    assert "slow_link" not in {x.code for x in found("slow-drafter")}


def test_a_slowed_target_rank_is_named_the_straggler() -> None:
    """DFLASH_FAULT=slow:target:0.4:rank=1: its forward takes 400 ms longer."""
    f = one(found("slow-target"), "rank_straggler")
    assert f.title.startswith("rank 1 (target 1) is a straggler on ")
    assert "per batch (forward " in f.evidence and "ms, its target peer's (" in f.evidence


def test_the_straggler_just_below_its_thresholds() -> None:
    s = rank_store("slow-drafter")
    ranks = list(timed(s).values())
    (st,) = rank_balance.stragglers(ranks, 1.5, 1.0, DEFAULT_CONFIG.rank_wait_frac)
    assert st.who.beat.rank == 3 and st.factor > 1.5
    at = dataclasses.replace(DEFAULT_CONFIG, straggler_factor=st.factor * 0.99)
    above = dataclasses.replace(DEFAULT_CONFIG, straggler_factor=st.factor * 1.01)
    assert "rank_straggler" in {f.code for f in found("slow-drafter", cfg=at)}
    assert "rank_straggler" not in {f.code for f in found("slow-drafter", cfg=above)}
    # The others must wait for it: with a wait share above what half of them wait, no one
    # is blamed (a slow rank nobody waits for slows nothing).
    shares = sorted((o.split.comm_share for o in st.waiting), reverse=True)
    need = shares[(len(ranks) - 1 + 1) // 2 - 1]  # the share the half-way waiter reaches
    busy = dataclasses.replace(DEFAULT_CONFIG, rank_wait_frac=need * 1.01)
    assert "rank_straggler" not in {f.code for f in found("slow-drafter", cfg=busy)}


def test_a_silent_rank_is_silent_not_a_straggler() -> None:
    """Edit: rank 3's heartbeat written 10 s before the others' (its `now` only)."""

    def behind(ranks: Beats) -> None:
        ranks[3]["now"] -= 10.0

    codes = [f.code for f in found("slow-drafter", behind)]
    assert codes == ["rank_silent"], codes


def test_a_slow_link_is_named_with_its_heaviest_waiters() -> None:
    """DFLASH_FAULT=slow:link:1.0: every target rank's sends take 1 s longer."""
    fs = found("slow-link")
    f = one(fs, "slow_link")
    assert "rank_straggler" not in {x.code for x in fs}
    assert f.title == "the ranks wait on the link between them"
    assert "4 ranks spend " in f.evidence and "with no straggler" in f.evidence
    assert "heaviest waiters: rank " in f.evidence
    assert "NCCL_DEBUG=INFO" in f.action


def test_the_slow_link_just_below_its_threshold() -> None:
    ranks = list(timed(rank_store("slow-link")).values())
    by_role: dict[str, list[float]] = {}
    for r in ranks:
        by_role.setdefault(r.beat.role, []).append(r.split.comm_share)
    # The least-waiting role's median share: just above it, that role does not wait.
    import statistics

    least = min(statistics.median(v) for v in by_role.values())
    at = dataclasses.replace(DEFAULT_CONFIG, rank_wait_frac=least * 0.99)
    above = dataclasses.replace(DEFAULT_CONFIG, rank_wait_frac=least * 1.01)
    assert "slow_link" in {f.code for f in found("slow-link", cfg=at)}
    assert "slow_link" not in {f.code for f in found("slow-link", cfg=above)}


def test_older_rank_files_without_loop_times_say_nothing() -> None:
    """Edit: the keys this schema added under version 1 removed (an older trainer's file)."""

    def older(ranks: Beats) -> None:
        for beat in ranks.values():
            for key in ("tok_s", "batches_s", "loop", "stages_ms"):
                del beat[key]

    s = rank_store("slow-drafter", older)
    assert len(ranks_view.beats(s.ranks)) == 4 and s.malformed == 0
    assert found("slow-drafter", older) == []
