"""Rules of the host (the agent's host sample) and the GIL: oversubscribed, memory or disk
short, GIL pressure."""

from __future__ import annotations

from dflash_tui.diagnosis.common import (
    live_heartbeat,
    possible,
    recent_heartbeats,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.fmt import size
from dflash_tui.stages import (
    PIPELINE_ROLES,
)
from dflash_tui.state import Store
from trainer.contract.checkpoints import CheckpointUse
from trainer.contract.phases import (
    TRAINING,
)
from trainer.contract.protocol import (
    HostSample,
)


# -- the host (the agent's host sample) ------------------------------------------------------
def _host(s: Store, now: float, cfg: DiagnosisConfig) -> HostSample | None:
    """The newest host sample, while it is fresh."""
    age = s.host_age(now)
    return s.host if age is not None and age <= cfg.host_max_age_s else None


def _load_per_cpu(host: HostSample) -> float | None:
    return host.load[0] / host.cpus if host.load else None


def _oversubscribed(host: HostSample | None, cfg: DiagnosisConfig) -> bool:
    per_cpu = _load_per_cpu(host) if host is not None else None
    return per_cpu is not None and per_cpu > cfg.oversubscribed_load


@rule(
    Code("host_oversubscribed", ("info",), "more runnable threads than CPUs on the host"),
    reads="the agent's host sample (1, 5 and 15 min load, usable CPUs, CPU busy)",
    decides="A host sample no older than `host_max_age_s` whose 1-min load per usable CPU is "
    "over `oversubscribed_load`. Context only: the 2-core CPU demo is oversubscribed by "
    "design.",
    thresholds=("host_max_age_s", "oversubscribed_load"),
    action="read throughput, stage times and GIL wake-ups as this host's, not the run's; to "
    "compare runs, run them on a host with CPUs to spare",
)
def host_oversubscribed(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """More runnable threads than CPUs: every thread waits for a CPU, so the pipeline's
    timings (throughput, stage times, GIL wake-ups) are the host's, not the run's. Context
    only: the 2-core CPU demo is oversubscribed by design."""
    host = _host(s, now, cfg)
    if host is None or not _oversubscribed(host, cfg):
        return []
    return [
        Finding(
            "info",
            "host_oversubscribed",
            f"host oversubscribed: load {host.load[0]:.1f} on {host.cpus} CPUs",
            f"1-min load {host.load[0]:.2f} on {host.cpus} usable CPUs: "
            f"{_load_per_cpu(host) or 0.0:.2f} per CPU, over {cfg.oversubscribed_load:g} "
            f"(5 and 15 min: {host.load[1]:.2f}, {host.load[2]:.2f})"
            + (f"; host CPU {host.cpu_pct:.0f}% busy" if host.cpu_pct is not None else ""),
            "read throughput, stage times and GIL wake-ups as this host's, not the run's; "
            "to compare runs, run them on a host with CPUs to spare",
        )
    ]


@rule(
    Code("host_memory_short", ("warning",), "the host's memory is nearly gone"),
    reads="the agent's host sample (memory available and total), the heartbeat",
    decides="A run lives (a heartbeat, not ended), the host sample is no older than "
    "`host_max_age_s`, and available memory is under `host_memory_frac` of the total: the "
    "OOM killer ends a run without a word.",
    thresholds=("host_max_age_s", "host_memory_frac"),
    action="free host memory (other processes, or a smaller prefetch queue or batch) before "
    "the OOM killer ends the run",
)
def host_memory_short(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Host memory nearly gone while a run lives: the OOM killer ends it without a word."""
    host = _host(s, now, cfg)
    if host is None or host.mem_total is None or host.mem_available is None or not host.mem_total:
        return []
    if s.heartbeat is None or s.ended():
        return []
    frac = host.mem_available / host.mem_total
    if frac >= cfg.host_memory_frac:
        return []
    return [
        Finding(
            "warning",
            "host_memory_short",
            f"host memory short: {size(host.mem_available)} available",
            f"{size(host.mem_available)} of {size(host.mem_total)} available ({frac:.1%}), under "
            f"{cfg.host_memory_frac:.0%}",
            "free host memory (other processes on this host, or a smaller prefetch queue or "
            "batch) before the OOM killer ends the run",
        )
    ]


def _checkpoints_to_come(s: Store) -> tuple[CheckpointUse, int, bool] | None:
    """(the run's checkpoints as on disk, how many it keeps (0: all), whether the size is the
    trainer's forecast): the runs list's when one is written, else the heartbeat's forecast
    from step 0 of the disk (none written yet); None when neither says."""
    hb, run = s.heartbeat, s.current_run()
    use = run.checkpoints if run is not None else None
    plan = hb.checkpoints if hb is not None else None
    keep = plan.keep if plan is not None else 0
    if use is not None:
        return use, keep, False
    if plan is None or hb is None or plan.forecast_bytes <= 0:
        return None
    every = plan.every
    # None written yet: the next is the first multiple of `every` after the current step.
    return CheckpointUse(0, hb.step, plan.forecast_bytes, every), keep, True


@rule(
    Code("disk_short", ("warning", "critical"), "the checkpoints to come will not fit on disk"),
    reads="the host sample's free disk under the run root, the runs list's checkpoints (count, "
    "newest size, interval), the heartbeat's total steps and its `checkpoints` (the trainer's "
    "forecast size before the first save, train.checkpoint_every, train.keep_checkpoints)",
    decides="A run lives and the host sample is no older than `host_max_age_s`: the "
    "checkpoints still to come (each as large as the newest, or before the first one as the "
    "trainer's forecast: 12 B per trained fp32 parameter and the rest) need more than the free "
    "space. Every one is kept, unless train.keep_checkpoints = N: then the files grow to N + 1 "
    "(the best held-out τ's) and one more is written before each pruning. Critical when not "
    "even the next one fits, a warning while a later one will not.",
    thresholds=("host_max_age_s",),
    action="free disk under the run root (old runs' checkpoints), or set "
    "train.keep_checkpoints, before the checkpoint named",
)
def disk_short(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The checkpoints still to come will not fit on the run root's disk. Critical once the
    next one alone does not fit (the run fails writing it: the H200's 27B-shaped run wrote
    14.8 of 22 GB with 14.1 GB free), a warning while a later one will not."""
    hb = s.heartbeat
    host = _host(s, now, cfg)
    to_come_of = _checkpoints_to_come(s)
    if hb is None or s.ended() or host is None or host.disk is None or to_come_of is None:
        return []
    use, keep, forecast = to_come_of
    each, free = use.newest_bytes, host.disk.free
    to_come = use.count_to_come(hb.total_steps)
    files = use.files_to_come(hb.total_steps, keep)
    if each <= 0 or files == 0 or free >= files * each:
        return []
    fit = free // each  # checkpoints that still fit
    first_short = use.step_to_come(fit + 1, hb.total_steps)
    every = (
        "only the last step's (config.json did not say how often)"
        if use.every is None
        else "the last step's"
        if use.every == 0
        else f"every {use.every} steps and the last step's"
    )
    sized = (
        f"none written yet: the trainer forecasts {size(each)} each"
        if forecast
        else f"the newest checkpoint (step {use.newest_step}) is {size(each)}"
    )
    kept = f"; {files} at once (train.keep_checkpoints = {keep})" if keep else ""
    evidence = (
        f"{size(free)} free on {host.disk.path}; {sized}; {to_come} more to come to step "
        f"{hb.total_steps} ({every}){kept}: {size(files * each)}"
    )
    if fit == 0:
        return [
            Finding(
                "critical",
                "disk_short",
                f"disk full for the next checkpoint (step {first_short})",
                evidence,
                f"free disk under {host.disk.path} now (old runs' checkpoints): the "
                f"checkpoint at step {first_short} needs {size(each)}",
            )
        ]
    return [
        Finding(
            "warning",
            "disk_short",
            f"disk short: {fit} of {files} checkpoints fit",
            evidence,
            f"free {size(files * each - free)} under {host.disk.path} (old runs' "
            f"checkpoints), or set train.keep_checkpoints, before the checkpoint at step "
            f"{first_short}",
        )
    ]


@rule(
    Code("checkpoint_failed", ("critical",), "a checkpoint could not be written"),
    reads="the heartbeat's `checkpoints.failed` (the newest save that failed, until one "
    "succeeds: its step and the trainer's one line) and `last_checkpoint`",
    decides="A run lives and its newest save failed: no part of it is on disk, the previous "
    "checkpoint stays the resume point and training goes on, so a stop now loses every step "
    "since that one.",
    action="free disk under the run root (or set train.keep_checkpoints) before the next "
    "save; the line says why it failed",
)
def checkpoint_failed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The trainer's newest checkpoint failed (disk full, any OSError): the run goes on,
    unprotected since its last good save."""
    hb = s.heartbeat
    plan = hb.checkpoints if hb is not None else None
    if hb is None or s.ended() or plan is None or plan.failed is None:
        return []
    failed, last = plan.failed, hb.last_checkpoint
    since = (
        f"the resume point stays {last.path} (step {last.step}): {hb.step - last.step} steps "
        "would be lost"
        if last is not None
        else f"no checkpoint of this run yet: {hb.step} steps would be lost"
    )
    return [
        Finding(
            "critical",
            "checkpoint_failed",
            f"checkpoint at step {failed.step} failed: {failed.message}",
            f"checkpoint at step {failed.step}: {failed.message}; {since}",
            "free disk under the run root (old runs' checkpoints) or set "
            "train.keep_checkpoints; the next save retries"
            if failed.message.startswith("disk full")
            else "read train.log's `checkpoint failed` line; the next save retries",
        )
    ]


@rule(
    Code("gil_pressure", ("warning",), "threads wake late: Python holds the GIL"),
    reads="the store's recent heartbeats' GIL probe (p50/p99 wake-up lateness, samples), the "
    "threads' CPU, the host sample",
    decides="While the pipeline trains (a fresh training heartbeat, a step within `stall_s`, "
    "nothing compiling) on a host not oversubscribed (load per CPU at most "
    "`oversubscribed_load`, from a sample no older than `host_max_age_s`): the last "
    "`gil_beats` heartbeats within `rise_window_s` all have a p99 lateness over `gil_p99_ms` "
    "from at least `gil_min_samples` wake-ups, and a pipeline thread uses `gil_busy_pct` % "
    "of a core or more.",
    thresholds=(
        "stale_factor",
        "stall_s",
        "host_max_age_s",
        "oversubscribed_load",
        "rise_window_s",
        "gil_beats",
        "gil_p99_ms",
        "gil_min_samples",
        "gil_busy_pct",
    ),
    action="move Python work off the pipeline threads (tokenising, collate) or run fewer "
    "threads in the process",
)
def gil_pressure(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A thread that sleeps 5 ms wakes late when other threads hold the GIL: the pipeline
    threads then wait on Python, not on the GPUs. Sustained over several heartbeats of the
    store's history only, as single spikes are common; and only while a pipeline thread is
    busy on a host with CPUs to spare: on an oversubscribed host every thread wakes late
    waiting for a CPU (host_oversubscribed says so), and threads that are mostly idle hold
    no GIL for long."""
    hb = live_heartbeat(s, now, cfg, TRAINING)
    if hb is None or not possible(s, now, cfg).tune or _oversubscribed(_host(s, now, cfg), cfg):
        return []
    beats = recent_heartbeats(s, hb.now, cfg.rise_window_s)[-cfg.gil_beats :]
    if len(beats) < cfg.gil_beats or not all(
        b.gil.p99_ms > cfg.gil_p99_ms and b.gil.samples >= cfg.gil_min_samples for b in beats
    ):
        return []
    pipeline = [t for t in hb.threads if t.role in PIPELINE_ROLES]
    if not pipeline or max(t.cpu_pct for t in pipeline) < cfg.gil_busy_pct:
        return []
    gil = hb.gil
    busiest = sorted(pipeline, key=lambda t: t.cpu_pct, reverse=True)[:3]
    return [
        Finding(
            "warning",
            "gil_pressure",
            f"GIL pressure: wake-ups {gil.p99_ms:.0f} ms late",
            f"p99 {gil.p99_ms:.0f} ms (p50 {gil.p50_ms:.1f} ms) in the last "
            f"{len(beats)} heartbeats, over {cfg.gil_p99_ms:.0f} ms; busiest: "
            + ", ".join(f"{t.name} {t.cpu_pct:.0f}%" for t in busiest),
            "move Python work off the pipeline threads (tokenising, collate) or run fewer "
            "threads in the process",
        )
    ]
