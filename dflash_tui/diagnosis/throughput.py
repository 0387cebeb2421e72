"""Rules of throughput: against a configured baseline, the run's own stable rate, and the
best earlier comparable run."""

from __future__ import annotations

import statistics

from dflash_tui.diagnosis.common import (
    live_heartbeat,
    possible,
    recent_rates,
    tok_rate,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.facts import (
    faster_environment,
)
from dflash_tui.state import Store
from dflash_tui.throughput_history import OwnDrop, earlier_best, logged_rates, own_drop
from trainer.contract.phases import (
    TRAINING,
)


@rule(
    Code("slow_throughput", ("warning",), "tok/s well below the configured baseline"),
    reads="`baseline_tok_s` (a target's config.toml), the recent tok/s (the last "
    "`rate_samples` metrics rows, else step lines, else the heartbeat)",
    decides="Only with `baseline_tok_s` set, and unless a heartbeat says the pipeline does "
    "not train now: the median of the recent rates more than `slow_pct` % below it.",
    thresholds=("baseline_tok_s", "stale_factor", "stall_s", "rate_samples", "slow_pct"),
    action="compare GPU use per role, queue depths and GIL with the baseline run",
)
def slow_throughput(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """tok/s well below the configured baseline (DiagnosisConfig.baseline_tok_s): the median
    of the last logged steps, so one slow step (a checkpoint) does not trigger it."""
    base = cfg.baseline_tok_s
    if not base or base <= 0:
        return []
    hb = s.heartbeat
    if hb is not None and not possible(s, now, cfg).tune:
        return []
    if hb is None and s.ended():
        return []
    rates, source = recent_rates(s, cfg)
    if not rates:
        return []
    current = statistics.median(rates)
    deficit = 100.0 * (1.0 - current / base)
    if deficit <= cfg.slow_pct:
        return []
    how = (
        "the heartbeat"
        if source == "heartbeat"
        else f"the last {source.removesuffix('s')}"
        if len(rates) == 1
        else f"median of the last {len(rates)} {source}"
    )
    return [
        Finding(
            "warning",
            "slow_throughput",
            f"tok/s {deficit:.0f}% below the {tok_rate(base)} baseline",
            f"{tok_rate(current)} tok/s ({how}) vs {tok_rate(base)}; "
            f"more than {cfg.slow_pct:.0f}% below",
            "compare GPU use per role, queue depths and GIL with the baseline run",
        )
    ]


# -- rules: baselines --
def _own_drop(s: Store, cfg: DiagnosisConfig) -> OwnDrop | None:
    return own_drop(s, cfg.drop_skip_rows, cfg.drop_rows, cfg.drop_min_stable, cfg.drop_pct)


@rule(
    Code("throughput_drop", ("warning",), "tok/s fell and stayed down against the run's own"),
    reads="metrics.jsonl's tok/s per logged step (throughput_history.py)",
    decides="Off when `baseline_tok_s` is set. Training with a fresh heartbeat: after the "
    "first `drop_skip_rows` logged steps, a stretch of at least `drop_rows` last steps each "
    "more than `drop_pct` % below the median of the steps before it (at least "
    "`drop_min_stable` of them).",
    thresholds=(
        "baseline_tok_s",
        "stale_factor",
        "drop_skip_rows",
        "drop_rows",
        "drop_min_stable",
        "drop_pct",
    ),
    action="compare GPU use per role, queue depths and stage times with before the step named",
)
def throughput_drop(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """tok/s fell and stayed down against the run's own stable median: every logged step of
    a stretch of at least drop_rows more than drop_pct below the median of the steps before
    it (throughput_history.own_drop), since which step said. Off when baseline_tok_s is set."""
    if cfg.baseline_tok_s or not live_heartbeat(s, now, cfg, TRAINING):
        return []
    got = _own_drop(s, cfg)
    if got is None:
        return []
    return [
        Finding(
            "warning",
            "throughput_drop",
            f"tok/s down {got.drop_pct:.0f}% from this run's own baseline",
            f"{tok_rate(got.recent_tok_s)} tok/s (median of the last {got.recent_rows} logged"
            f" steps) vs {tok_rate(got.stable_tok_s)} (median of the {got.stable_rows} logged"
            f" steps before); every logged step since step {got.slow_since} more than"
            f" {cfg.drop_pct:.0f}% below",
            f"compare GPU use per role, queue depths and stage times with before step"
            f" {got.slow_since}",
        )
    ]


@rule(
    Code("below_earlier_runs", ("warning",), "tok/s well below the best earlier comparable run"),
    reads="metrics.jsonl's tok/s per logged step, earlier comparable runs' best step "
    "(throughput_history.earlier_best)",
    decides="Off when `baseline_tok_s` is set. Training with a fresh heartbeat, at least "
    "`rate_samples` logged steps after the first `drop_skip_rows`, and even the fastest of "
    "the last `rate_samples` more than `earlier_pct` % below the best step of an earlier run "
    "of the same shape and layout. Quiet when the run dropped against itself "
    "(throughput_drop) or a faster run's environment differs (environment_changed).",
    thresholds=(
        "baseline_tok_s",
        "stale_factor",
        "drop_skip_rows",
        "rate_samples",
        "earlier_pct",
        "drop_rows",
        "drop_min_stable",
        "drop_pct",
        "slow_pct",
    ),
    action="compare this run's GPU use, queues and stage times with the earlier run named",
)
def below_earlier_runs(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """tok/s well below the best earlier comparable run (trainer/contract/comparable.py via
    facts.earlier_runs): every one of the last rate_samples logged steps after the first
    drop_skip_rows more than earlier_pct below it. The earlier figure is a best step, so
    this run's fastest recent step is what must fall short: a median against a best would
    find a gap in noise alone. Off when baseline_tok_s is set; quiet when the run dropped
    against itself (throughput_drop speaks) or its environment differs (environment_changed
    speaks)."""
    if cfg.baseline_tok_s or not live_heartbeat(s, now, cfg, TRAINING):
        return []
    rows = [v for _, v in logged_rates(s)[cfg.drop_skip_rows :]]
    if len(rows) < cfg.rate_samples:
        return []  # still in compile / warm-up steps
    best = earlier_best(s)
    if best is None:
        return []
    recent = rows[-cfg.rate_samples :]
    if max(recent) >= best.tok_s * (1.0 - cfg.earlier_pct / 100.0):
        return []
    if _own_drop(s, cfg) is not None:
        return []
    current = statistics.median(recent)
    if faster_environment(s, current, 1.0 + cfg.slow_pct / 100.0) is not None:
        return []
    deficit = 100.0 * (1.0 - current / best.tok_s)
    return [
        Finding(
            "warning",
            "below_earlier_runs",
            f"tok/s {deficit:.0f}% below earlier run {best.run_id}",
            f"{tok_rate(current)} tok/s (median of the last {len(recent)} logged steps, the"
            f" fastest {tok_rate(max(recent))}) vs {tok_rate(best.tok_s)}, the best of run"
            f" {best.run_id} (same shape and layout); every one more than"
            f" {cfg.earlier_pct:.0f}% below",
            f"compare this run's GPU use, queues and stage times with run {best.run_id}",
        )
    ]
