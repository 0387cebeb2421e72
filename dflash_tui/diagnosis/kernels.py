"""Rules of compiling, kernels and the environment: recompiles after warm-up, CUDA graphs
that fell back to eager, the slow torch fallback, an environment that differs from a faster
run's."""

from __future__ import annotations

import statistics

from dflash_tui import cuda_graphs
from dflash_tui.diagnosis.common import (
    dur,
    live_heartbeat,
    possible,
    recent_heartbeats,
    recent_rates,
    rise_in_window,
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
from trainer.contract.environment import INSTALL, Preflight
from trainer.contract.phases import (
    TRAINING,
)


@rule(
    Code("recompiles", ("warning",), "torch.compile compiled graphs after warm-up"),
    reads="the heartbeat's compile counters (recompiles, graphs, the last recompile's reason) "
    "and their history in the store's heartbeats",
    decides="Training with a fresh heartbeat and a recompile count above 0; the evidence says "
    "how much it rose in the last `rise_window_s`.",
    thresholds=("stale_factor", "rise_window_s"),
    action="make the input's shape, dtype or grad mode the same as in warm-up (bucket or pad "
    "it); with no reason given, rerun with TORCH_LOGS=recompiles",
)
def recompiles(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """torch.compile compiled graphs after warm-up: every new shape or guard failure stalls
    all threads for seconds to minutes. Says how much the count rose lately (the store's
    heartbeat history)."""
    hb = live_heartbeat(s, now, cfg, TRAINING)
    if hb is None or hb.compile.recompiles <= 0:
        return []
    comp = hb.compile
    n = comp.recompiles
    points = [
        (b.now, float(b.compile.recompiles))
        for b in recent_heartbeats(s, hb.now, cfg.rise_window_s)
    ]
    rise, over = rise_in_window(points, n, hb.now, cfg.rise_window_s)
    evidence = f"{n} graphs compiled after warm-up ({comp.graphs} in all)"
    if rise > 0:
        evidence += f", +{rise:.0f} in the last {dur(over)}"
    why = comp.last_recompile
    if why:
        evidence += f"; last: {why}"
    action = (
        "make that input's shape, dtype or grad mode the same as in warm-up (bucket or pad it)"
        if why
        else "a shape or dtype changed after warm-up: rerun with TORCH_LOGS=recompiles to see "
        "which guard failed"
    )
    return [
        Finding(
            "warning",
            "recompiles",
            f"{n} recompile{'s' if n != 1 else ''} during training",
            evidence,
            action,
        )
    ]


@rule(
    Code("graphs_fell_back", ("warning",), "CUDA graph captures failed: that work runs eagerly"),
    reads="the heartbeat's `graphs` (per place the trainer captures CUDA graphs: captures, "
    "replays, failed captures with their reasons, runs done eagerly)",
    decides="A fresh heartbeat in which some place has failed captures and either ran its "
    "work eagerly since or never captured at all. The evidence quotes the last reason.",
    thresholds=("stale_factor",),
    action="nothing is lost (the eager path gives the same numbers, slower); the reason says "
    'what broke the capture; set that place\'s graphs off (eval.cuda_graphs = "off") to '
    "stop retrying, or report the reason",
)
def graphs_fell_back(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A CUDA graph capture failed (another thread's allocation during a global capture, an
    op that cannot be captured, memory): the trainer ran that work eagerly instead and says
    so in the heartbeat. Operators asked whether graphs work: this is the answer when not."""
    hb = live_heartbeat(s, now, cfg)
    if hb is None:
        return []
    out = []
    for place, g in cuda_graphs.places(hb):
        if not cuda_graphs.fell_back(g):
            continue
        evidence = (
            f"{place}: {g.failed} capture{'s' if g.failed != 1 else ''} failed, "
            f"{g.eager_runs} run{'s' if g.eager_runs != 1 else ''} eagerly, "
            f"{g.captured} captured, {g.replays} replays"
        )
        reason = cuda_graphs.last_reason(g)
        if reason:
            evidence += f"; last: {reason}"
        out.append(
            Finding(
                "warning",
                "graphs_fell_back",
                f"CUDA graphs of the {place} fell back to eager",
                evidence,
                f"the {place} gives the same numbers eagerly, only slower; the reason says "
                f'what broke the capture (set {place}.cuda_graphs = "off" to stop retrying)',
            )
        )
    return out


def _preflight(s: Store) -> Preflight | None:
    """The followed run's fast-kernel preflight: the heartbeat's, else config.json's."""
    if s.heartbeat is not None and s.heartbeat.preflight is not None:
        return s.heartbeat.preflight
    cur = s.current_run()
    return cur.preflight if cur else None


@rule(
    Code("slow_kernels", ("warning",), "a GPU run's target is on the slow torch fallback"),
    reads="the fast-kernel preflight (the heartbeat's, else config.json's)",
    decides="A GPU run (preflight device cuda) with a layer type on the slow path: a fast "
    "kernel package it needs is missing or unused, or installed but failing its tiny call on "
    "the GPU. A CPU run's torch path is no finding.",
    action="install the packages named (pip install …) in the trainer's Python and restart "
    "(r); a failing package needs a build that matches this torch and GPU",
)
def slow_kernels(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The target runs transformers' reference PyTorch code for a layer type whose fast
    kernels are missing (Gated DeltaNet without fla; causal-conv1d is optional: transformers logs
    a warning), or an installed fast kernel failed its tiny call on the GPU. From the
    trainer's preflight (trainer/targets/preflight.py); a CPU run's torch path is no finding."""
    pf = _preflight(s)
    if pf is None or not pf.device.startswith("cuda"):
        return []
    bad = pf.slow()
    if not bad:
        return []
    parts, fixes, failing = [], [], False
    for lp in bad:
        reasons = []
        for p in lp.packages:
            if p.used is False or p.version is None:
                reasons.append(f"{p.name} {p.error or 'not installed'}")
                fixes.append(INSTALL.get(p.name, f"pip install {p.distribution or p.name}"))
            elif p.working is False:
                failing = True
                reasons.append(f"{p.name} {p.version} fails on {pf.device}: {p.error}")
        parts.append(f"{lp.layer_type} ({lp.count} layers, path {lp.path}): {'; '.join(reasons)}")
    evidence = "; ".join(parts) + (
        f" (transformers {pf.transformers}, {pf.decided_by})" if pf.transformers else ""
    )
    if fixes:
        title = f"target on the slow torch fallback: {', '.join(lp.layer_type for lp in bad)}"
        action = (
            " && ".join(dict.fromkeys(fixes))
            + " in the trainer's Python, then restart (r); transformers picks them at import"
        )
    else:
        title = "a fast kernel fails on this GPU"
        action = "install a build of the failing package that matches this torch and GPU"
    if failing and fixes:
        action += "; a failing package needs a build that matches this torch and GPU"
    return [Finding("warning", "slow_kernels", title, evidence, action)]


@rule(
    Code(
        "environment_changed",
        ("warning",),
        "slower than a comparable run whose environment differs",
    ),
    reads="the recent tok/s (the last `rate_samples` metrics rows, else step lines, else the "
    "heartbeat), earlier comparable runs' best tok/s and environments",
    decides="Unless a heartbeat says the pipeline does not train now (a step within "
    "`stall_s`, nothing compiling): the last earlier comparable run whose best tok/s is more "
    "than `slow_pct` % above the median of the recent rates, when both runs recorded their "
    "environment and it differs.",
    thresholds=("stale_factor", "stall_s", "rate_samples", "slow_pct"),
    action="put back what differs, or compare the two runs' config.json run.environment",
)
def environment_changed(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """This run trains more slowly than the last earlier comparable run (same config
    signature, trainer/contract/comparable.py) and its environment differs from that run's:
    name what differs ("transformers 5.17.0 → 5.24.0, fla missing")."""
    hb = s.heartbeat
    if hb is not None and not possible(s, now, cfg).tune:
        return []
    rates, _source = recent_rates(s, cfg)
    if not rates:
        return []
    current = statistics.median(rates)
    change = faster_environment(s, current, 1.0 + cfg.slow_pct / 100.0)
    if change is None:
        return []
    what = ", ".join(change.differences)
    before = change.run.environment.describe() if change.run.environment else "?"
    return [
        Finding(
            "warning",
            "environment_changed",
            f"environment differs from a faster run: {what}",
            f"{tok_rate(current)} tok/s now; run {change.run.run_id} (same config) trained at "
            f"{tok_rate(change.tok_s)} tok/s on: {before}",
            f"put back what differs ({what}), or compare the two runs' config.json run.environment",
        )
    ]
