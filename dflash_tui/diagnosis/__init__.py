"""Diagnosis: rules that read the store and say what is wrong, with evidence and a fix.

Pure Python, shared by the headless view and the TUI. Each rule is a function of the store,
the time and a `DiagnosisConfig`, returning findings; `diagnose()` runs them all, most severe
first (rules of one severity keep their registration order: causes before symptoms).

Rules hold no state of their own: they read the store's typed records. History is what the
store keeps: its bounded heartbeat history (every live heartbeat and telemetry.jsonl: GIL
lateness, recompiles, allocator retries), metrics.jsonl rows, GPU samples, and the runs list;
what earlier runs say about this one comes from dflash_tui/facts.py. So a finding does not
depend on how often a view happens to call `diagnose()`.

The rules live in modules by concern (process, ranks, liveness, training, pipeline, gpus,
memory, host, kernels, throughput, heldout), each registered with its documentation
(`registry.rule`); `RULES` below is the order `diagnose()` runs them in. `dflash-tui explain
CODE` and docs/findings.md are generated from the same registry (`docs.py`).
"""

from __future__ import annotations

import time

from dflash_tui.diagnosis.common import Possible, possible
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    GIB,
    HEARTBEAT_MAX_INTERVAL_S,
    SEVERITY_ORDER,
    DiagnosisConfig,
    config_for,
)
from dflash_tui.diagnosis.gpus import (
    CLOCK_HOLDS,
    allocator_retries,
    gpu_ecc_errors,
    gpu_throttled,
    gpu_wedged,
    role_memory_short,
)
from dflash_tui.diagnosis.heldout import eval_failed, eval_plateau, eval_skipped, overfitting
from dflash_tui.diagnosis.host import (
    checkpoint_failed,
    disk_short,
    gil_pressure,
    host_memory_short,
    host_oversubscribed,
)
from dflash_tui.diagnosis.kernels import (
    environment_changed,
    graphs_fell_back,
    recompiles,
    slow_kernels,
)
from dflash_tui.diagnosis.liveness import (
    SLOW_VISITS,
    no_step_line_yet,
    output_buffered,
    slow_phase,
    stalled_loop,
    stop_stalled,
    wandb_info,
)
from dflash_tui.diagnosis.memory import memory_swing_rule
from dflash_tui.diagnosis.pipeline import (
    STAGE_SIDES,
    VERDICTS,
    WAITED_ON,
    mostly_padding,
    pipeline_bottleneck,
    stuck_target,
    thread_straggler,
)
from dflash_tui.diagnosis.process import (
    KILLED_UNKNOWN,
    code_mismatch,
    crashed,
    died_before_log,
    heartbeat_unreadable,
    memory_held_after_kill,
    stale_heartbeat,
    unreachable,
)
from dflash_tui.diagnosis.ranks import (
    rank_failed,
    rank_marks,
    rank_silent,
    rank_straggler,
    slow_link,
)
from dflash_tui.diagnosis.registry import DOCS, Code, Finding, Rule, RuleDoc, document, rule
from dflash_tui.diagnosis.throughput import below_earlier_runs, slow_throughput, throughput_drop
from dflash_tui.diagnosis.training import (
    grad_norm_spike,
    loss_diverging,
    loss_not_finite,
    not_learning,
)
from dflash_tui.facts import phase_expectation
from dflash_tui.state import Store

# The order diagnose() runs the rules in; findings of one severity keep it (causes before
# symptoms): the link and the process's end first, then stalls, training health, the
# pipeline, the surroundings, and the baselines last.
RULES: list[Rule] = [
    unreachable,
    gpu_wedged,
    crashed,
    died_before_log,
    stale_heartbeat,
    heartbeat_unreadable,
    rank_silent,
    rank_failed,
    rank_straggler,
    slow_link,
    stalled_loop,
    stop_stalled,
    loss_not_finite,
    loss_diverging,
    not_learning,
    grad_norm_spike,
    output_buffered,
    thread_straggler,
    stuck_target,
    pipeline_bottleneck,
    role_memory_short,
    memory_held_after_kill,
    slow_phase,
    code_mismatch,
    recompiles,
    graphs_fell_back,
    mostly_padding,
    allocator_retries,
    memory_swing_rule,
    host_oversubscribed,
    host_memory_short,
    disk_short,
    checkpoint_failed,
    gil_pressure,
    slow_kernels,
    environment_changed,
    gpu_throttled,
    gpu_ecc_errors,
    slow_throughput,
    no_step_line_yet,
    eval_failed,
    overfitting,
    eval_plateau,
    eval_skipped,
    throughput_drop,
    below_earlier_runs,
]

# diagnose() itself raises one code: a rule that failed.
DIAGNOSE_DOC = document(
    RuleDoc(
        rule="diagnose",
        module="__init__",
        codes=(Code("rule_error", ("info",), "a rule failed on odd input; the others still ran"),),
        reads="every rule's exception",
        decides="A rule raised an exception (odd input it did not expect): its name and the "
        "exception are the finding, and the other rules' findings stand.",
        thresholds=(),
        action="report it with the run's heartbeat.json; the other rules still ran",
    )
)


def diagnose(
    s: Store, now: float | None = None, config: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    # The store's clock (injectable for frozen snapshots) when no time is given.
    now = getattr(s, "clock", time.time)() if now is None else now
    found: list[Finding] = []
    for r in RULES:
        try:
            found.extend(r(s, now, config))
        except Exception as e:  # one rule tripping on odd input must not blank the others
            found.append(
                Finding(
                    "info",
                    "rule_error",
                    f"diagnosis rule {getattr(r, '__name__', r)} failed",
                    f"{type(e).__name__}: {e}",
                    "report this with the run's heartbeat.json; the other rules still ran",
                )
            )
    return sorted(found, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


__all__ = [
    "CLOCK_HOLDS",
    "DEFAULT_CONFIG",
    "DIAGNOSE_DOC",
    "DOCS",
    "GIB",
    "HEARTBEAT_MAX_INTERVAL_S",
    "KILLED_UNKNOWN",
    "RULES",
    "SEVERITY_ORDER",
    "SLOW_VISITS",
    "STAGE_SIDES",
    "VERDICTS",
    "WAITED_ON",
    "Code",
    "DiagnosisConfig",
    "Finding",
    "Possible",
    "Rule",
    "RuleDoc",
    "allocator_retries",
    "below_earlier_runs",
    "checkpoint_failed",
    "code_mismatch",
    "config_for",
    "crashed",
    "diagnose",
    "died_before_log",
    "disk_short",
    "document",
    "environment_changed",
    "eval_failed",
    "eval_plateau",
    "eval_skipped",
    "gil_pressure",
    "gpu_ecc_errors",
    "gpu_throttled",
    "gpu_wedged",
    "grad_norm_spike",
    "graphs_fell_back",
    "heartbeat_unreadable",
    "host_memory_short",
    "host_oversubscribed",
    "loss_diverging",
    "loss_not_finite",
    "memory_held_after_kill",
    "mostly_padding",
    "no_step_line_yet",
    "not_learning",
    "output_buffered",
    "overfitting",
    "phase_expectation",
    "pipeline_bottleneck",
    "possible",
    "rank_failed",
    "rank_marks",
    "rank_silent",
    "rank_straggler",
    "recompiles",
    "role_memory_short",
    "rule",
    "slow_kernels",
    "slow_link",
    "slow_phase",
    "slow_throughput",
    "stale_heartbeat",
    "stalled_loop",
    "stop_stalled",
    "stuck_target",
    "throughput_drop",
    "unreachable",
    "wandb_info",
]
