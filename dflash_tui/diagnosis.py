"""Diagnosis: rules that read the store and say what is wrong, with evidence and a fix.

Pure Python, shared by the headless view and the TUI. Each rule is a function of the store,
the time and a `DiagnosisConfig`, returning findings; `diagnose()` runs them all, most severe
first (rules of one severity keep their registration order: causes before symptoms).

Rules hold no state of their own: they read the store's typed records. History is what the
store keeps: its bounded heartbeat history (every live heartbeat and telemetry.jsonl: GIL
lateness, recompiles, allocator retries), metrics.jsonl rows, GPU samples, and the runs list;
what earlier runs say about this one comes from dflash_tui/facts.py. So a finding does not
depend on how often a view happens to call `diagnose()`.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from dflash_tui import compile_progress, evaluation, rank_balance, ranks_view
from dflash_tui.facts import (
    current_visit,
    earlier_runs,
    expected_memory,
    faster_environment,
    phase_comparison,
    phase_expectation,
)
from dflash_tui.fmt import duration, rate, size
from dflash_tui.stages import (
    PIPELINE_ROLES,
    ThreadStages,
    busiest,
    ms_text,
    of_heartbeat,
    of_role,
    thread_stages,
)
from dflash_tui.state import Store, clock_reason_names
from dflash_tui.throughput_history import OwnDrop, earlier_best, logged_rates, own_drop
from trainer.contract.environment import INSTALL, Preflight
from trainer.contract.evaluation import EvalInfo, EvalPoint
from trainer.contract.heartbeat import (
    SAVING_CHECKPOINT,
    STAGE_HOST,
    STAGE_WAIT_HS,
    STAGE_WAIT_PRE,
    WAIT_HS_EMPTY,
    WAIT_HS_FULL,
    WAIT_PRE_EMPTY,
    DeviceMemory,
    Heartbeat,
    WandbInfo,
)
from trainer.contract.phases import (
    CHECKPOINTING,
    COMPILING,
    CRASHED,
    FINAL_PHASES,
    LOADING_DATA,
    LOADING_TARGET,
    STOPPING,
    TARGET_WAIT,
    TRAINING,
    phase_spans,
)
from trainer.contract.protocol import (
    CLOCK_APP_SETTING,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_IDLE,
    CLOCK_POWER_BRAKE,
    CLOCK_POWER_CAP,
    CLOCK_SLOWDOWNS,
    CLOCK_SW_THERMAL,
    CLOCK_SYNC_BOOST,
    HostSample,
)
from trainer.contract.records import ExitRecord, MetricsRow, OomCheck
from trainer.contract.typed import encode, finite

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEARTBEAT_MAX_INTERVAL_S = 2.0  # the contract: replaced every <= 2 s
GIB = 1 << 30

# The visits slow_phase compares with earlier runs (start-up ones that can stall on a disk,
# a network mount or a cold compile cache).
SLOW_VISITS = (LOADING_DATA, LOADING_TARGET, COMPILING, TARGET_WAIT)


@dataclass(frozen=True)
class DiagnosisConfig:
    """Every threshold the rules use. Defaults suit the contract's 2 s heartbeat."""

    # liveness
    stale_factor: float = 3.0  # heartbeat older than this many intervals: hung or dead
    stall_s: float = 120.0  # training, fresh heartbeat, no step for this long: stalled loop
    buffered_s: float = 60.0  # steps advance this long with no step line: stdout buffered
    # a stop (SIGTERM: the last checkpoint, the threads' exit) that earlier comparable runs
    # never took this long over (slow_phase_factor and _margin_s); with none to compare:
    stop_stall_s: float = 180.0
    # slow phases, against the same visit of earlier comparable runs (dflash_tui/facts.py)
    slow_phase_factor: float = 2.0  # slower than this many times the usual duration …
    slow_phase_margin_s: float = 60.0  # … and by more than this (short phases jitter)
    # throughput
    baseline_tok_s: float | None = None  # no baseline, no throughput finding
    slow_pct: float = 10.0  # tok/s more than this % below the baseline
    rate_samples: int = 5  # logged steps whose median tok/s is compared
    # throughput against history (dflash_tui/throughput_history.py); baseline_tok_s overrides
    drop_pct: float = 30.0  # each step of the slow stretch this % below the stable median
    drop_rows: int = 5  # … a stretch of at least this many logged steps (not one checkpoint)
    drop_skip_rows: int = 3  # the first logged steps (compile, warm-up) are no baseline
    drop_min_stable: int = 5  # the stable window needs at least this many logged steps
    # every one of the last rate_samples logged steps this % below the best earlier
    # comparable run's best step (a best against a best: a CPU run's steps vary 2x)
    earlier_pct: float = 40.0
    # data: more of each batch than this is padding
    padding_frac: float = 0.5
    # GIL
    gil_p99_ms: float = 20.0  # p99 wake-up lateness of the heartbeat's probe thread
    gil_beats: int = 3  # … over this many successive heartbeats (single spikes are common)
    gil_min_samples: int = 20  # a probe that woke fewer times says nothing
    # … and only while a pipeline thread is busy (% of one core): late wake-ups with every
    # thread mostly idle are a CPU shortage, not a thread holding the GIL.
    gil_busy_pct: float = 50.0
    # host context (the agent's host sample)
    host_max_age_s: float = 30.0  # a host sample older than this says nothing
    oversubscribed_load: float = 1.5  # 1-min load per usable CPU above this: oversubscribed
    host_memory_frac: float = 0.05  # available memory under this share of the total: short
    # pipeline balance
    idle_util_pct: float = 10.0  # a role's GPUs at or below this mean utilisation are idle
    util_window_s: float = 30.0  # GPU utilisation is averaged over this window
    queue_window_s: float = 120.0  # queue depths from metrics records this recent
    queue_empty_frac: float = 0.1  # depth <= this fraction of capacity: empty
    queue_full_frac: float = 0.9  # depth >= this fraction of capacity: full (q_pre)
    # Backed up: at least this full in every sample. Half, because a drafter is fed by
    # T/gcd(T, D) of the T targets' queues while the heartbeat counts all T in q_hs's
    # capacity (T = D = 2: 4/8 is as full as it gets).
    backed_up_frac: float = 0.5
    starved_s: float = 30.0  # no GPU: threads waiting on a queue this long are idle
    # Prefetch threads at or above this mean CPU % (of one core) compute their batches: more
    # threads help. Below it they wait (the data source, a disk): more threads would wait too.
    prefetch_cpu_bound_pct: float = 50.0
    stuck_s: float = 60.0  # no GPU: a target busy in one state this long with a full q_pre
    # Stage times (ThreadInfo.stages_ms), where the heartbeat has them: a role whose threads
    # wait this share of their loop on one queue (or, on a GPU, on the host) is starved;
    # with GPUs of its own, that share of the time they sit idle.
    stage_wait_frac: float = 0.4
    # … and without GPUs, a target busy in one state for this many of its loops (at least
    # stuck_min_s) with a full q_pre is stuck (stuck_s without stage times).
    stuck_loops: float = 20.0
    stuck_min_s: float = 30.0
    # processes mode: the ranks' loops (rank_balance.py, heartbeat-rank's stages_ms)
    straggler_factor: float = 1.5  # compute per loop this many times its role peers' median
    straggler_min_ms: float = 1.0  # … and this many ms above it (0 vs 0.01 ms is no straggler)
    rank_min_steps: int = 10  # a rank's medians speak once it is this many steps in
    rank_wait_frac: float = 0.3  # a rank that spends this share of its loop in comm waits
    # memory
    role_memory_frac: float = 0.9  # a GPU holding less than this × its role's usual peak
    held_min_bytes: int = GIB  # memory left on a GPU after the run ended worth naming
    held_grace_s: float = 10.0  # the driver frees memory a few seconds after exit
    # counters that must not rise (allocator retries, recompiles)
    rise_window_s: float = 600.0
    # held-out τ (Heartbeat.eval, dflash_tui/evaluation.py)
    plateau_evals: int = 3  # this many evals since the best and none better: a plateau
    tau_noise_frac: float = 0.05  # τ this share below the best or more has fallen, not jittered
    overfit_acc_rise: float = 0.01  # … while training acc rose by this (absolute) or more
    overfit_critical_frac: float = 0.15  # fallen this far: critical
    # GPU health (NVML's clock event reasons, SM clocks, ECC counts: protocol.GpuDevice)
    throttle_window_s: float = 120.0  # GPU samples this recent are looked at
    throttle_share: float = 0.5  # throttled in at least this share of them: sustained
    throttle_min_samples: int = 3  # fewer samples with reasons say nothing
    clock_gap_frac: float = 0.1  # median SM clock this far below its role peers': slower
    ecc_rise_min: int = 1  # uncorrected ECC errors that appeared during the run: critical
    # training health, from metrics.jsonl rows (loss, acc, streak, grad_norm)
    health_warmup_steps: int = 100  # rows up to this step say nothing (the trainer's default
    # LR warm-up, train.warmup_steps: the loss falls fast, acc is ~0, grad norms are large)
    diverge_factor: float = 1.5  # the median loss of the last rows above this × the best …
    diverge_rows: int = 3  # … over this many rows (one bad batch is one row), with at least
    # as many rows past warm-up before them
    not_learning_acc: float = 0.01  # acc below this in every row past warm-up …
    not_learning_steps: int = 50  # … over this many steps …
    not_learning_loss_frac: float = 0.05  # … while the loss fell by less than this share
    grad_spike_factor: float = 10.0  # a row's grad norm above this × the median before it …
    grad_spike_count: int = 2  # … in this many …
    grad_spike_rows: int = 10  # … of the last this many rows (one spike is a blip)
    grad_spike_baseline_rows: int = 3  # the median needs this many rows past warm-up


DEFAULT_CONFIG = DiagnosisConfig()


@dataclass(frozen=True)
class Finding:
    severity: str  # critical | warning | info
    code: str
    title: str
    evidence: str
    action: str


Rule = Callable[[Store, float, DiagnosisConfig], list[Finding]]
RULES: list[Rule] = []


R = TypeVar("R", bound=Rule)


def rule(fn: R) -> R:
    """Register a rule; it keeps its own signature (callable with or without a config)."""
    RULES.append(fn)
    return fn


# -- small helpers ------------------------------------------------------------------------
def _dur(seconds: float) -> str:
    return duration(max(0.0, seconds))


def _rate(tok_s: float) -> str:
    return rate(tok_s).removesuffix(" tok/s")


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GB"


def _fresh(s: Store, now: float, cfg: DiagnosisConfig) -> bool:
    age = s.heartbeat_age(now)
    return age is not None and age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S


def _live(s: Store, now: float, cfg: DiagnosisConfig, *phases: str) -> Heartbeat | None:
    """The heartbeat of a running run with a fresh heartbeat (in one of `phases` if given).

    Rules about a working pipeline say nothing from an old snapshot: stale_heartbeat speaks."""
    hb = s.heartbeat
    if hb is None or s.ended() or not _fresh(s, now, cfg):
        return None
    if phases and hb.phase not in phases:
        return None
    return hb


def _phase_age(s: Store, now: float) -> float | None:
    hb = s.heartbeat
    if hb is None or not hb.phase_started_at:
        return None
    return s.remote_now(now) - hb.phase_started_at


# -- what the run's state allows ------------------------------------------------------------
@dataclass(frozen=True)
class Possible:
    """Which kinds of action the run's state allows: one answer that every rule's action obeys.

    `signal`: the run's process is there (not ended: no exit.json, not dead by the agent's
    liveness, no final phase), so dump stacks (d) and kill (k) can reach it.
    `tune`: the pipeline trains now (a fresh heartbeat in training, a step within `stall_s`,
    no graph compiling): only then is throughput advice (bottlenecks, GIL, padding, memory per
    role) about the pipeline; in a stall or a compile every thread waits on that instead."""

    signal: bool
    tune: bool


def possible(s: Store, now: float, cfg: DiagnosisConfig) -> Possible:
    hb = _live(s, now, cfg, TRAINING)
    stepping = (
        hb is not None
        and hb.last_step_at is not None
        and hb.now - hb.last_step_at < cfg.stall_s
        and hb.compile.current is None
    )
    return Possible(signal=not s.ended(), tune=stepping)


# -- history: the store's heartbeats ---------------------------------------------------------
def _recent(s: Store, t_now: float, window_s: float) -> list[Heartbeat]:
    """The store's heartbeats of this run within `window_s` before `t_now`, oldest first."""
    return [b for b in s.heartbeats if 0.0 <= t_now - b.now <= window_s]


def _rise(
    points: Iterable[tuple[float, float]], current: float, now: float, window_s: float
) -> tuple[float, float]:
    """(how much `current` rose since the oldest point in the window, over how long)."""
    inside = sorted((t, v) for t, v in points if now - t <= window_s)
    if not inside:
        return 0.0, 0.0
    t0, v0 = inside[0]
    return current - v0, now - t0


# -- GPUs and queues ------------------------------------------------------------------------
def _role_gpus(s: Store, role: str, exclusive: bool = False) -> list[int]:
    """GPUs running a `role` thread; `exclusive`: not shared with the other model's role."""
    other = {"target": "drafter", "drafter": "target"}.get(role)
    devices = s.gpu_devices()
    out = []
    for index, roles in sorted(s.gpu_roles().items()):
        parts = roles.split("+")
        if role in parts and not (exclusive and other in parts) and index in devices:
            out.append(index)
    return out


def _util(s: Store, index: int, now: float, cfg: DiagnosisConfig) -> float | None:
    """Mean utilisation of one GPU over the window (one sample at 100% means little)."""
    since = s.remote_now(now) - cfg.util_window_s
    recent = [p.util for p in s.gpu_history.get(index, ()) if p.t >= since and p.util is not None]
    if recent:
        return float(statistics.fmean(recent))
    device = s.gpu_devices().get(index)
    return None if device is None or device.util is None else float(device.util)


@dataclass
class _Queues:
    pre_cap: list[int]
    hs_cap: list[int]
    samples: list[tuple[list[int], list[int]]]  # (q_pre depths, q_hs depths), oldest first
    span_s: float

    def every(self, which: int, test: Callable[[int, int], bool], i: int | None = None) -> bool:
        """`test(depth, capacity)` holds in every sample, for queue i (or all queues)."""
        caps = self.pre_cap if which == 0 else self.hs_cap
        idx = range(len(caps)) if i is None else [i]
        return bool(caps) and all(test(smp[which][j], caps[j]) for smp in self.samples for j in idx)

    def text(self, which: int, only: Sequence[int] | None = None) -> str:
        name, caps = ("q_pre", self.pre_cap) if which == 0 else ("q_hs", self.hs_cap)
        depths = self.samples[-1][which]
        idx = range(len(caps)) if only is None else only
        return f"{name} " + " ".join(f"{depths[j]}/{caps[j]}" for j in idx)

    def span(self) -> str:
        n = len(self.samples)
        return "1 sample" if n == 1 else f"all {n} samples over {_dur(self.span_s)}"


def _queues(s: Store, hb: Heartbeat, now: float, cfg: DiagnosisConfig) -> _Queues | None:
    """Queue depths now (heartbeat) and at the recent logged steps (metrics.jsonl)."""
    pre, hs = hb.queues.q_pre, hb.queues.q_hs
    if not pre and not hs:
        return None
    cur = ([q.depth for q in pre], [q.depth for q in hs])
    caps = ([q.capacity for q in pre], [q.capacity for q in hs])
    t_now = hb.now
    since, t0 = s.remote_now(now) - cfg.queue_window_s, t_now
    older: list[tuple[list[int], list[int]]] = []
    for m in reversed(s.metrics):  # newest first: stop at the window's edge
        if m.time < since:
            break
        if (len(m.q_pre), len(m.q_hs)) == (len(cur[0]), len(cur[1])):
            older.append((list(m.q_pre), list(m.q_hs)))
            t0 = min(t0, m.time)
    return _Queues(caps[0], caps[1], [*reversed(older), cur], max(0.0, t_now - t0))


def _empty(cfg: DiagnosisConfig) -> Callable[[int, int], bool]:
    return lambda depth, cap: depth <= cap * cfg.queue_empty_frac


def _idle(
    s: Store, hb: Heartbeat, role: str, waiting: str, now: float, cfg: DiagnosisConfig
) -> str | None:
    """Evidence that `role` sits idle, or None. With GPUs: its GPUs' mean utilisation. Without
    (the CPU demo): every thread of the role blocked in `waiting` for a long time, since one
    queue wait between two batches is normal."""
    gpus = _role_gpus(s, role, exclusive=True)
    if gpus:
        utils = {i: _util(s, i, now, cfg) for i in gpus}
        known = [u for u in utils.values() if u is not None]
        if not known or statistics.fmean(known) > cfg.idle_util_pct:
            return None
        return f"{role} GPUs " + ", ".join(
            f"{i} {u:.0f}%" for i, u in utils.items() if u is not None
        )
    # Every thread of the role blocked for long, at least one on this queue: the others may
    # wait at the replicas' barrier for the starved one.
    threads = hb.threads_of(role)
    blocked = all(
        t.state.startswith("waiting") and hb.in_state_s(t) >= cfg.starved_s for t in threads
    )
    if not threads or not blocked or all(t.state != waiting for t in threads):
        return None
    by_state: dict[str, list[str]] = {}
    for t in threads:
        by_state.setdefault(t.state, []).append(t.name)
    waited = min(hb.in_state_s(t) for t in threads)
    return (
        ", ".join(f"{', '.join(names)} {state}" for state, names in by_state.items())
        + f" for {_dur(waited)}+"
    )


# -- stage times -----------------------------------------------------------------------------
VERDICTS = {  # the bottleneck findings: (title, action), from queues or stage times alike
    "prefetch_bottleneck": (
        "data prefetch is the bottleneck",
        "add prefetch threads or make batch building cheaper (tokenise ahead)",
    ),
    "targets_bottleneck": (
        "targets are the bottleneck",
        "give the targets more GPUs or the drafters fewer; check the target threads",
    ),
    "drafters_bottleneck": (
        "drafters are the bottleneck",
        "add drafter replicas or give the drafters less work per batch",
    ),
}
# What each wait stage is a wait for, in evidence.
WAITED_ON = {STAGE_WAIT_PRE: "q_pre", STAGE_WAIT_HS: "q_hs", STAGE_HOST: "the host (Python)"}


def _mean_share(rows: list[ThreadStages], stage: str) -> float:
    return statistics.fmean(r.share(stage) for r in rows) if rows else 0.0


def _own_gpus(hb: Heartbeat, role: str) -> bool:
    """Every thread of `role` drives a GPU that no thread of the other model runs on: its
    stream's idle time is the GPU's (a shared GPU stays busy with the other stream)."""
    other = {"target": "drafter", "drafter": "target"}[role]
    mine = {t.device for t in hb.threads_of(role)}
    theirs = {t.device for t in hb.threads_of(other)}
    return bool(mine) and all(d.startswith("cuda") for d in mine) and not mine & theirs


def _waits_text(rows: list[ThreadStages], stage: str) -> str:
    """`drafter-0 waits 58% of its 266 ms step on q_hs (drafter-1 51%)`: the worst first."""
    worst = sorted(rows, key=lambda r: -r.share(stage))
    first = worst[0]
    text = (
        f"{first.name} waits {first.share(stage):.0%} of its {ms_text(first.period_ms)} "
        f"{first.loop} on {WAITED_ON.get(stage, stage)}"
    )
    others = ", ".join(f"{r.name} {r.share(stage):.0%}" for r in worst[1:4])
    return text + (f" ({others}{', …' if len(worst) > 4 else ''})" if others else "")


def _works_text(rows: list[ThreadStages]) -> str:
    """`target-0's forward takes 251 ms of its 262 ms loop`: the busiest thread of a role."""
    b = busiest(rows)
    top = b.top_work() if b else None
    if b is None or top is None:
        return ""
    return f"{b.name}'s {top.name} takes {ms_text(top.ms)} of its {ms_text(b.period_ms)} {b.loop}"


def _stage_evidence(rows: list[ThreadStages], role: str, stage: str, upstream: str) -> str:
    """Both sides of a queue in stage times: the starved role's wait, the busy role's work."""
    starved = _waits_text(of_role(rows, role), stage) if of_role(rows, role) else ""
    busy = _works_text(of_role(rows, upstream))
    return "; ".join(x for x in (starved, busy) if x)


def _stage_bottleneck(
    s: Store, hb: Heartbeat, q: _Queues, now: float, cfg: DiagnosisConfig
) -> tuple[str, str, str, str] | None:
    """The bottleneck from stage times: the role whose threads wait a large share of their
    loop on a queue is starved by the one upstream of that queue, whose work fills its loop.
    Said only when the starved role really idles: on GPUs of its own the wait is GPU idle
    time; sharing a device (or on the CPU) only threads blocked for long count (`_idle`).
    None when the heartbeat has no stage times, or they are of loops before a thread's
    current state (it has been in it for many loops)."""
    rows = of_heartbeat(hb)
    if not rows or any(r.stale() for r in rows):
        return None
    frac = cfg.stage_wait_frac
    cases = (
        # (starved role, its wait stage, its blocked state, upstream role, verdict)
        ("target", STAGE_WAIT_PRE, WAIT_PRE_EMPTY, "prefetch", "prefetch_bottleneck"),
        ("drafter", STAGE_WAIT_HS, WAIT_HS_EMPTY, "target", "targets_bottleneck"),
        ("target", STAGE_WAIT_HS, WAIT_HS_FULL, "drafter", "drafters_bottleneck"),
    )
    for role, stage, blocked, upstream, code in cases:
        if _mean_share(of_role(rows, role), stage) < frac:
            continue
        if _own_gpus(hb, role):
            idle = _idle_gpus(s, role, now, cfg)  # "" where NVML gave no utilisation
        else:
            found = _idle(s, hb, role, blocked, now, cfg)
            if found is None:
                return None  # its device is busy with the other threads' work
            idle = found
        title, action = VERDICTS[code]
        evidence = _stage_evidence(rows, role, stage, upstream)
        evidence += f"; {q.text(0 if stage == STAGE_WAIT_PRE else 1)}"
        return code, title, evidence + (f"; {idle}" if idle else ""), action
    # No queue waits: a GPU of its own idle between kernels is waiting for Python.
    for role in ("drafter", "target"):
        mine = of_role(rows, role)
        if _own_gpus(hb, role) and _mean_share(mine, STAGE_HOST) >= frac:
            idle = _idle_gpus(s, role, now, cfg)
            return (
                "host_bottleneck",
                f"{role}s' GPUs wait for Python",
                _waits_text(mine, STAGE_HOST)
                + "; its stream idles between the kernels its Python thread launches"
                + (f"; {idle}" if idle else ""),
                "fewer, larger kernels: compile the drafter (train.compile_drafter), a larger "
                "batch; check GIL pressure and the threads' CPU",
            )
    return None


def _idle_gpus(s: Store, role: str, now: float, cfg: DiagnosisConfig) -> str:
    """`drafter GPUs 5 41%, 6 40%`: the role's GPUs' mean utilisation, where sampled."""
    utils = {i: _util(s, i, now, cfg) for i in _role_gpus(s, role, exclusive=True)}
    known = {i: u for i, u in utils.items() if u is not None}
    return f"{role} GPUs " + ", ".join(f"{i} {u:.0f}%" for i, u in known.items()) if known else ""


# -- rules: the run's life ------------------------------------------------------------------
@rule
def unreachable(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The link is refused (bad SSH settings: no retry) or keeps failing: nothing else the
    monitor shows is current."""
    if s.link.state in ("refused",):
        return [
            Finding(
                "critical",
                "link_refused",
                "connection refused",
                s.link.detail,
                "fix the SSH settings named above; dflash-tui will not retry",
            )
        ]
    if s.link.state in ("reconnecting", "connecting") and s.link.attempt > 0:
        return [
            Finding(
                "critical",
                "unreachable",
                f"cannot reach {s.target}",
                s.link.detail,
                "check the host and network; retrying with backoff",
            )
        ]
    return []


@rule
def crashed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The trainer reported a crash, or exited non-zero or by a signal (exit.json)."""
    hb = s.heartbeat
    ex = s.exit_info()
    unclean = ex is not None and (ex.exit_code not in (0, None) or ex.signal is not None)
    if not (hb is not None and hb.phase == CRASHED) and not unclean:
        return []
    err = hb.error if hb else None
    message = (err.message if err else "") or (ex.error if ex else "") or ""
    where = f" in {err.thread}" if err and err.thread else ""
    if ex is not None and ex.signal and not message:
        # No exception: a signal ended it (the OOM killer, a kill -9). The outcome's word;
        # the step is the last heartbeat's (evidence), which may be a second behind.
        evidence, action = _no_error_evidence(s, ex), KILLED_UNKNOWN
        if ex.oom is not None:
            found, action = _oom_words(ex.oom)
            evidence += f"; {found}"
        return [Finding("critical", "killed", f"run killed by {ex.signal}", evidence, action)]
    if ex is not None and ex.signal:
        how = f"killed by {ex.signal}"
    else:
        how = f"exit code {ex.exit_code if ex is not None else hb.exit_code if hb else None}"
    last_tb = (err.traceback if err else "").strip().splitlines()[-1:] or [""]
    return [
        Finding(
            "critical",
            "crashed",
            f"run crashed{where} ({how})",
            message or last_tb[0] or _no_error_evidence(s, ex),
            "read the traceback (heartbeat error / train.log), fix, then restart (r)",
        )
    ]


KILLED_UNKNOWN = (
    "no handler runs on SIGKILL: look for the OOM killer in the host's kernel log "
    "(dmesg -T | grep -i -e oom -e 'killed process') or whoever sent it; then restart (r)"
)


def _oom_words(oom: OomCheck) -> tuple[str, str]:
    """(what the wrapper found of the OOM killer after the SIGKILL, the action it leads to):
    the memory cgroup's oom_kill count since launch and the kernel log, each as read, or why
    not (dflash_tui/agent/oom.py)."""
    # A count that fell (a hostile file, a cgroup made anew) recorded no kill of this run.
    kills = None if oom.oom_kills is None else max(0, oom.oom_kills)
    where = f"{posixpath.basename(oom.events)} of {posixpath.dirname(oom.events)}"
    if oom.kernel:
        kernel = f"kernel: {oom.kernel[-1]}"
    elif oom.kernel_error:
        kernel = f"kernel log not readable ({oom.kernel_error})"
    else:
        kernel = "the kernel log names no OOM kill of the trainer"
    if kills:
        count = f"oom_kill {kills} in {where} since launch: the kernel's OOM killer"
    elif kills == 0:
        count = f"no OOM kill recorded in {where}"
    else:
        count = f"{oom.events or 'memory cgroup'} not readable ({oom.events_error})"
    if oom.oom_killed():
        return f"{count}; {kernel}", (
            "the host's memory ran out (not the GPU's): raise the memory limit of that cgroup "
            "or lower the trainer's host memory (batch, the largest seq bucket, data workers); "
            "then restart (r)"
        )
    if kills == 0 and not oom.kernel_error:
        words = f"{count}, {kernel}: something else sent SIGKILL"
    elif kills == 0:
        words = f"{count}: something else sent SIGKILL; {kernel}"
    else:
        return f"{count}; {kernel}", KILLED_UNKNOWN
    return words, (
        "find who sent SIGKILL (a kill -9 by hand or by a script, a job scheduler, the "
        "container runtime); then restart (r)"
    )


def _no_error_evidence(s: Store, ex: ExitRecord | None) -> str:
    """What is known of a crash that recorded no error: where it was, and (unless a signal
    says it all) the logs' last words that are not step lines."""
    hb = s.heartbeat
    phase = (ex.final_phase if ex else None) or (hb.phase if hb else None)
    step = ex.step if ex is not None and ex.step is not None else hb.step if hb else None
    facts = ["no error recorded"]
    if phase or step is not None:
        facts.append(
            f"last heartbeat: phase {phase or '?'}, step {step if step is not None else '?'}"
        )
    if ex is None or not ex.signal:
        said = [
            ln
            for ln in list(s.log_lines)[-5:] + list(s.launch_log)[-2:]
            if ln.strip() and " step=" not in ln
        ]
        # The trainer says a bad input in one `error: …` line: that line, when there is one.
        facts.extend([ln for ln in said if ln.startswith("error")][-1:] or said[-2:])
    return "; ".join(facts)


@rule
def died_before_log(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The run exited (not cleanly) before its first step: show the launcher's and the log's
    last lines at once instead of leaving the operator to `ls` the run dir. The heartbeat's
    step decides, not the step lines: a run logging every 50 steps that dies at step 15 has
    none and did not die at start."""
    ex = s.exit_info()
    hb = s.heartbeat
    if ex is None or s.step_lines or (hb is not None and hb.step > 0):
        return []
    if ex.exit_code == 0 and not ex.error:
        return []
    tail = [ln for ln in list(s.launch_log)[-3:] + list(s.log_lines)[-3:] if ln.strip()]
    errors = [ln for ln in tail if ln.startswith("error")]
    tail = errors[-1:] + [ln for ln in tail if ln not in errors]
    return [
        Finding(
            "critical",
            "died_at_start",
            "the run exited before its first step",
            " | ".join(tail[-4:]) or str(encode(ex)),
            "see launch.log and train.log in the run dir; fix and relaunch",
        )
    ]


@rule
def stale_heartbeat(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat thread writes every <= 2 s whatever the loop does: an old heartbeat means
    the whole process is hung (GIL held, D state) or dead."""
    hb = s.heartbeat
    if hb is None or hb.phase in FINAL_PHASES:
        return []
    age = s.heartbeat_age(now)
    if age is None or age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []
    dead = not possible(s, now, cfg).signal
    what = "process dead" if dead else "process hung or dead"
    return [
        Finding(
            "critical",
            "stale_heartbeat",
            what,
            f"heartbeat is {_dur(age)} old (pid {hb.pid}, phase "
            f"{hb.phase}); it is rewritten every <= 2 s by its own thread",
            "the process is gone: the finding above says how; restart (r)"
            if dead
            else "dump stacks (d); if nothing answers, kill (k) and restart (r)",
        )
    ]


@rule
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
                f"its heartbeat is {_dur(lag)} behind the freshest rank's (pid {b.pid}, "
                f"{b.device}, last phase {b.phase} at step {b.step}); each rank rewrites it "
                "every <= 2 s",
                "dump stacks (d): its section says where it waits; if it answers nothing, "
                "kill (K) and restart (r)",
            )
        )
    return found


@rule
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
            f"{b.error.message} (rank {b.rank}, pid {b.pid}, {b.device}, step {b.step})",
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
    if _live(s, now, cfg, TRAINING) is None or len(s.ranks) < 2:
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


@rule
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


@rule
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


@rule
def stalled_loop(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Fresh heartbeat, old last_step_at: the process lives but the training loop is stuck;
    name the pipeline thread that has been in one state the longest. A checkpoint that does
    not finish stops the loop too (a full or hung disk): said as such."""
    hb = s.heartbeat
    if hb is None or hb.phase not in (TRAINING, CHECKPOINTING) or not hb.last_step_at:
        return []
    if (s.heartbeat_age(now) or 0) > cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []  # the process itself is stale: stale_heartbeat says it
    if not possible(s, now, cfg).signal:
        return []  # a dead process's last heartbeat: how it ended is the finding, not a stall
    since_step = hb.now - hb.last_step_at
    if since_step < cfg.stall_s:
        return []
    usual = _usual_checkpoint(s, hb) if hb.phase == CHECKPOINTING else None
    if usual is not None:
        # A save that always takes minutes (a big drafter's optimizer state, a network disk)
        # is not a stall at `stall_s`: the run's own saves, else earlier runs', set the bar.
        in_save = hb.now - hb.phase_started_at
        if in_save < max(cfg.stall_s, cfg.slow_phase_factor * usual[0] + cfg.slow_phase_margin_s):
            return []
    threads = [t for t in hb.threads if t.role in ("drafter", "target", "prefetch")]
    if hb.phase == CHECKPOINTING:  # the saving thread is where it is stuck, not its waiters
        threads = [t for t in threads if t.state == SAVING_CHECKPOINT] or threads
    # The stuck thread is the one at work, not those waiting on it: one hung replica leaves
    # its peers at the step's barrier and the targets at a full q_hs, as long or longer.
    working = [t for t in threads if not t.state.startswith("waiting")]
    stuck = max(working or threads, key=hb.in_state_s, default=None)
    where = (
        f"{stuck.name} ({stuck.state} for {_dur(hb.in_state_s(stuck))})"
        if stuck
        else "an unknown thread"
    )
    if hb.phase == CHECKPOINTING:
        return [
            Finding(
                "critical",
                "checkpoint_stalled",
                f"checkpoint after step {hb.step} stalled in {where}",
                f"heartbeat fresh, checkpointing for {_dur(hb.now - hb.phase_started_at)}, "
                f"no step for {_dur(since_step)}"
                + (f"; a save usually takes {_dur(usual[0])} ({usual[1]})" if usual else ""),
                "check the disk under the run dir (free space, a slow or hung mount); dump "
                "stacks (d) to see where the save waits",
            )
        ]
    return [
        Finding(
            "critical",
            "loop_stalled",
            f"training loop stalled in {where}",
            f"heartbeat fresh, but no step for {_dur(since_step)} (step {hb.step})",
            "dump stacks (d) to see where it waits",
        )
    ]


def _usual_checkpoint(s: Store, hb: Heartbeat) -> tuple[float, str] | None:
    """(the median seconds of a checkpoint save, whose): this run's finished saves, else the
    saves of earlier comparable runs; None when neither has one."""
    spans = phase_spans(hb.phase_history)[:-1]  # the save under way is the last
    own = [sp.seconds(hb.now) for sp in spans if sp.phase == CHECKPOINTING]
    if own:
        return statistics.median(own), f"median of this run's {len(own)} earlier saves"
    past = [
        v for r in earlier_runs(s) for k, v in r.phases.items() if k.split("#")[0] == CHECKPOINTING
    ]
    if past:
        return statistics.median(past), f"median of {len(past)} saves of earlier runs"
    return None


@rule
def stop_stalled(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Stopping (asked to stop: the last checkpoint, then every thread's exit) far longer
    than earlier comparable runs took to stop, or than `stop_stall_s` with none: a save on a
    hung disk, or a thread that never looks at the stop flag. Until it ends, its GPU memory
    stays held and a relaunch is refused."""
    hb = _live(s, now, cfg, STOPPING)
    if hb is None or not hb.phase_started_at:
        return []
    elapsed = s.remote_now(now) - hb.phase_started_at
    key = current_visit(hb)
    past = [(r.run_id, r.phases[key]) for r in earlier_runs(s) if key in r.phases]
    if past:
        usual = statistics.median(v for _, v in past)
        bar = max(cfg.slow_phase_factor * usual, usual + cfg.slow_phase_margin_s)
        against = f"earlier runs stopped in {_dur(usual)} (median of {len(past)}; last: run "
        against += f"{past[-1][0]}, {_dur(past[-1][1])})"
    else:
        bar, against = (
            cfg.stop_stall_s,
            f"no earlier comparable run to compare with; bar {_dur(cfg.stop_stall_s)}",
        )
    if elapsed < bar:
        return []
    threads = [t for t in hb.threads if t.state not in ("done", "")]
    stuck = max(threads, key=hb.in_state_s, default=None)
    where = f"; {stuck.name} {stuck.state} for {_dur(hb.in_state_s(stuck))}" if stuck else ""
    return [
        Finding(
            "warning",
            "stop_stalled",
            f"stopping for {_dur(elapsed)} at step {hb.step}",
            f"heartbeat fresh, stopping for {_dur(elapsed)}; {against}{where}",
            "dump stacks (d) to see what the stop waits for; kill (k) sends SIGKILL after its "
            "timeout (the newest good checkpoint stays)",
        )
    ]


@rule
def loss_not_finite(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The logged loss is NaN or infinite: the weights are poisoned from that step on and
    every further step is wasted. Names the first bad step and the last good one."""
    rows = [(m.step, m.loss) for m in s.metrics] or [(x.step, x.loss) for x in s.step_lines]
    if not rows or finite(rows[-1][1]) is not None:
        return []
    good = [(step, loss) for step, loss in rows if finite(loss) is not None]
    last_good = good[-1] if good else None
    since = next(step for step, loss in rows if finite(loss) is None and
                 (last_good is None or step > last_good[0]))  # fmt: skip
    bad = sum(1 for step, _ in rows if step >= since)
    evidence = f"loss {rows[-1][1]} at step {rows[-1][0]}, non-finite in {bad} logged steps"
    before = f"before step {since}"
    if last_good is not None:
        evidence += f"; last finite {last_good[1]:.4f} at step {last_good[0]}"
        before = f"at or before step {last_good[0]}"
    alive = possible(s, now, cfg).signal
    return [
        Finding(
            "critical",
            "loss_not_finite",
            f"loss is {rows[-1][1]} from step {since} on",
            evidence,
            ("kill it (k): every step from here trains on NaN weights; " if alive else "")
            + f"resume from a checkpoint {before} with a lower lr or grad_clip, and look at "
            "the batches after it",
        )
    ]


def _past_warmup(s: Store, cfg: DiagnosisConfig) -> list[MetricsRow]:
    """The store's metrics rows after the warm-up, oldest first."""
    return [m for m in s.metrics if m.step > cfg.health_warmup_steps]


def _loss(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 100 else f"{x:.4g}"


@rule
def loss_diverging(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The loss climbed well above its own best and stays there: the median of the last
    `diverge_rows` rows is more than `diverge_factor` times the lowest loss of the rows
    before them, all past warm-up (an lr too high for this point, a bad data shard). A NaN
    loss is loss_not_finite's; a single bad batch moves one row, not the median."""
    rows = _past_warmup(s, cfg)
    if not rows or finite(rows[-1].loss) is None:
        return []
    rows = [m for m in rows if finite(m.loss) is not None]
    k = max(1, cfg.diverge_rows)
    recent, before = rows[-k:], rows[:-k]
    if len(recent) < k or len(before) < k:
        return []
    best = min(before, key=lambda m: m.loss)
    median = statistics.median(m.loss for m in recent)
    if best.loss <= 0 or median <= cfg.diverge_factor * best.loss:
        return []
    since = next(m for m in rows if m.step > best.step and m.loss > cfg.diverge_factor * best.loss)
    return [
        Finding(
            "warning",
            "loss_diverging",
            f"loss diverging: {median / best.loss:.1f}× its best since step {since.step}",
            f"median loss {_loss(median)} over steps {recent[0].step}–{recent[-1].step} "
            f"({len(recent)} logged), {median / best.loss:.2f}× the best {_loss(best.loss)} at "
            f"step {best.step}; first above {cfg.diverge_factor:g}× at step {since.step} "
            f"({_loss(since.loss)}, lr {since.lr:.3g})",
            f"restart from a checkpoint at or before step {best.step} with a lower train.lr "
            "(or a smaller train.grad_clip)",
        )
    ]


@rule
def not_learning(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Accuracy flat at ~0 (every row below `not_learning_acc`, streak ~1: only the anchor)
    for `not_learning_steps` past warm-up while the loss does not fall either: no progress,
    so every further step is wasted (critical). A loss still falling is learning, however
    slowly: said nothing. A NaN loss is loss_not_finite's."""
    rows = _past_warmup(s, cfg)
    flat: list[MetricsRow] = []
    for m in reversed(rows):  # the newest rows all below the bar
        if finite(m.acc) is None or m.acc >= cfg.not_learning_acc or finite(m.loss) is None:
            break
        flat.append(m)
    flat.reverse()
    if len(flat) < 2 or flat[-1].step - flat[0].step < cfg.not_learning_steps:
        return []
    first, last = flat[0], flat[-1]
    if first.loss > 0 and last.loss < first.loss * (1 - cfg.not_learning_loss_frac):
        return []
    change = (last.loss - first.loss) / first.loss * 100 if first.loss > 0 else 0.0
    lrs = sorted({m.lr for m in flat})
    lr = f"lr {lrs[0]:.3g}" if len(lrs) == 1 else f"lr {lrs[0]:.3g}–{lrs[-1]:.3g}"
    return [
        Finding(
            "critical",
            "not_learning",
            f"not learning: acc ~0 for {last.step - first.step} steps",
            f"acc <= {max(m.acc for m in flat):.3f} and streak <= "
            f"{max(m.streak for m in flat):.2f} in every logged step from {first.step} to "
            f"{last.step} ({len(flat)} rows); loss {_loss(first.loss)} → {_loss(last.loss)} "
            f"({change:+.1f} %); {lr}",
            ("kill it (k): " if not s.ended() else "")
            + "check train.lr and the data's loss mask (answer tokens kept) before relaunching",
        )
    ]


def _grad_spikes(rows: list[MetricsRow], cfg: DiagnosisConfig) -> list[tuple[MetricsRow, float]]:
    """Each row whose grad norm is above `grad_spike_factor` × the median of the rows before
    it that were not spikes themselves (repeated spikes must not raise their own bar), with
    that median."""
    normal: list[float] = []
    spikes: list[tuple[MetricsRow, float]] = []
    for m in rows:
        norm = finite(m.grad_norm)
        if norm is None:
            continue
        if len(normal) >= cfg.grad_spike_baseline_rows:
            median = statistics.median(normal)
            if median > 0 and norm > cfg.grad_spike_factor * median:
                spikes.append((m, median))
                continue
        normal.append(norm)
    return spikes


@rule
def grad_norm_spike(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The gradient norm before clipping (metrics rows' grad_norm: a row's largest) many
    times its own running median, in `grad_spike_count` of the last `grad_spike_rows` rows
    past warm-up: batches the model cannot fit, or an lr on the edge. One spike is a blip."""
    rows = [m for m in _past_warmup(s, cfg) if m.grad_norm is not None]
    last = rows[-max(1, cfg.grad_spike_rows) :]
    spikes = [(m, med) for m, med in _grad_spikes(rows, cfg) if last and m.step >= last[0].step]
    if len(spikes) < max(1, cfg.grad_spike_count):
        return []
    newest, median = spikes[-1]
    assert newest.grad_norm is not None
    # A row's norm is the largest of the steps since the row before: say those steps.
    previous = {b.step: a.step for a, b in zip(s.metrics, list(s.metrics)[1:], strict=False)}

    def steps_of(m: MetricsRow) -> str:
        first = previous.get(m.step, m.step - 1) + 1
        return f"{first}–{m.step}" if first < m.step else str(m.step)

    steps = ", ".join(steps_of(m) for m, _ in spikes)
    return [
        Finding(
            "warning",
            "grad_norm_spike",
            f"gradient norm spikes in {len(spikes)} of the last {len(last)} logged rows",
            f"grad norm {newest.grad_norm:.4g} in steps {steps_of(newest)}, "
            f"{newest.grad_norm / median:.0f}× the running median {median:.4g}; above "
            f"{cfg.grad_spike_factor:g}× it in steps {steps}",
            "look at the batches of those steps for a malformed or very long sample",
        )
    ]


@rule
def output_buffered(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat's step advances but train.log gets no step line: stdout is buffered (or
    goes elsewhere), so anyone reading the log thinks the run is not training."""
    hb = s.heartbeat
    if hb is None or hb.phase != TRAINING or not s.follow_received:
        return []
    last_line_step = s.step_lines[-1].step if s.step_lines else 0
    if hb.step - last_line_step < 2:
        return []
    # By the step the last line names, not by when it was read: lines that come in bursts
    # (a block buffer flushing) arrive fresh yet name a step minutes old, and `status`
    # reads a whole tail at once. metrics.jsonl, written line by line with the step line,
    # says when the next line was due.
    due = next((r for r in s.metrics if r.step > last_line_step and r.time > 0), None)
    if due is not None:
        late = s.remote_now(now) - due.time
        since = f"; step {due.step}'s line was due {duration(late)} ago (metrics.jsonl has it)"
    else:
        reference = s.last_step_line_at
        if reference is None:
            started = [v.started_at for v in hb.phase_history if v.phase == TRAINING]
            reference = started[-1] if started else None
        if reference is None:
            return []
        late, since = s.remote_now(now) - reference, ""
    if late < cfg.buffered_s:
        return []
    return [
        Finding(
            "warning",
            "output_buffered",
            "output buffered: steps advance, no step line",
            f"heartbeat at step {hb.step}, train.log's last step line is "
            f"{'step ' + str(last_line_step) if s.step_lines else 'none'}{since}",
            "run python with -u or PYTHONUNBUFFERED=1, or print(..., flush=True)",
        )
    ]


# -- rules: the pipeline --------------------------------------------------------------------
@rule
def stuck_target(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A target with a full q_pre that does not work: its thread in one state all along while
    its GPU sat idle over the same window (or, without GPUs, in one busy state for a minute;
    with stage times, for `stuck_loops` of its loops, at least `stuck_min_s`).
    It has input and room for output (unless it waits on a full q_hs: then the drafters are
    slow, not it), so its thread is stuck. A small model keeps its GPU near idle while its
    thread cycles through its states every few milliseconds: that is not stuck."""
    hb = _live(s, now, cfg, TRAINING)
    q = _queues(s, hb, now, cfg) if hb else None
    if hb is None or q is None:
        return []
    threads = hb.threads_of("target")
    by_name = {t.name: t for t in threads}
    stuck: list[tuple[int, str]] = []
    for i in range(len(q.pre_cap)):
        if not q.every(0, lambda d, c: d >= c * cfg.queue_full_frac, i):
            continue
        # q_pre[i] feeds thread target-i (trainer/runtime/pipeline.py); else the i-th target thread.
        th = by_name.get(f"target-{i}") or (threads[i] if i < len(threads) else None)
        if th is not None and th.state == WAIT_HS_FULL:
            continue
        row = thread_stages(hb, th) if th is not None else None
        if th is None:
            name, doing, gpu = f"target {i}", "no thread info", None
        else:
            name, doing = th.name, f"'{th.state}' for {_dur(hb.in_state_s(th))}"
            gpu = s.thread_gpu(th)
        top = row.top_work() if row else None
        if row is not None and top is not None:
            # What its loop took before: the same state for many of them is no slow loop.
            doing += f", its loop {ms_text(row.period_ms)} ({top.name} {ms_text(top.ms)})"
        # Without GPUs: busy for many of its loops when its stage times say how long one is.
        busy_s = cfg.stuck_s
        if row is not None:
            busy_s = max(cfg.stuck_loops * row.period_ms / 1e3, cfg.stuck_min_s)
        if gpu is not None:
            util = _util(s, gpu, now, cfg)
            if util is None or util > cfg.idle_util_pct:
                continue
            if th is not None and hb.in_state_s(th) < cfg.util_window_s:
                continue
            stuck.append((i, f"{name} on GPU {gpu} at {util:.0f}%, {doing}"))
        elif th and not th.state.startswith("waiting") and hb.in_state_s(th) >= busy_s:
            stuck.append((i, f"{name} {doing}"))
    if not stuck:
        return []
    ids = [i for i, _ in stuck]
    who = f"target {ids[0]}" if len(ids) == 1 else "targets " + ", ".join(map(str, ids))
    return [
        Finding(
            "warning",
            "target_stuck",
            f"{who} idle with a full q_pre",
            "; ".join(e for _, e in stuck) + f"; {q.text(0, ids)} ({q.span()})",
            f"dump stacks (d) to see where {stuck[0][1].split()[0]} waits",
        )
    ]


@rule
def pipeline_bottleneck(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Which stage starves the others, said only when the starved side really sits idle:
    some stage always limits a pipeline, and only idle hardware makes that worth a warning.
    From stage times where the heartbeat has them (targets waiting on q_pre -> data
    prefetch; drafters waiting on q_hs -> the targets; targets waiting on a full q_hs -> the
    drafters; a GPU stream of its own waiting on the host -> Python), idle being that wait on
    GPUs of their own; else from the queues between them (q_pre empty -> data prefetch;
    q_hs empty with idle drafters -> the targets; q_hs and q_pre backed up with idle targets
    -> the drafters), idle being GPU utilisation. Without GPUs of its own, idle is threads
    blocked for long."""
    hb = _live(s, now, cfg, TRAINING) if possible(s, now, cfg).tune else None
    q = _queues(s, hb, now, cfg) if hb else None
    verdict = _bottleneck(s, hb, q, now, cfg) if hb and q else None
    if verdict is None:
        return []
    code, title, evidence, action = verdict
    if code == "prefetch_bottleneck" and hb is not None:
        evidence, action = _prefetch_cpu_bound(s, hb, cfg, evidence, action)
    return [Finding("warning", code, title, evidence, action)]


def _prefetch_cpu_bound(
    s: Store, hb: Heartbeat, cfg: DiagnosisConfig, evidence: str, action: str
) -> tuple[str, str]:
    """More prefetch threads help only threads that compute: the prefetch threads' CPU
    (ThreadInfo.cpu_pct, the trainer's /proc/self/task reading) averaged over the store's
    heartbeats of the utilisation window decides between that advice and a wait on I/O."""
    beats = [*_recent(s, hb.now, cfg.util_window_s), hb]
    by_beat = {b.now: [t.cpu_pct for t in b.threads_of("prefetch")] for b in beats}
    samples = [pct for pcts in by_beat.values() for pct in pcts]
    if not samples:
        return evidence, action  # a trainer that names no prefetch threads: no CPU to judge
    cpu = statistics.fmean(samples)
    n = sum(1 for pcts in by_beat.values() if pcts)
    evidence += f"; prefetch threads {cpu:.0f}% CPU on average over {n} heartbeat" + (
        "s" if n != 1 else ""
    )
    if cpu >= cfg.prefetch_cpu_bound_pct:
        return evidence, action
    return evidence, (
        f"prefetch waits, it does not compute (under {cfg.prefetch_cpu_bound_pct:.0f}% CPU): "
        "more threads would wait too; check the data source and the disk it is read from "
        "(a slow or network mount, I/O wait)"
    )


# Which queue each verdict is about, in stage times: (starved role, its wait, upstream).
STAGE_SIDES = {
    "prefetch_bottleneck": ("target", STAGE_WAIT_PRE, "prefetch"),
    "targets_bottleneck": ("drafter", STAGE_WAIT_HS, "target"),
    "drafters_bottleneck": ("target", STAGE_WAIT_HS, "drafter"),
}


def _bottleneck(
    s: Store, hb: Heartbeat, q: _Queues, now: float, cfg: DiagnosisConfig
) -> tuple[str, str, str, str] | None:
    """(code, title, evidence, action) of the stage that starves an idle one, or None. From
    the stage times where the heartbeat has them; else (an older trainer, or loops that
    have not ended for long: a stall) from the queue depths and the threads' states, the
    stage times of the threads still looping added to the evidence."""
    verdict = _stage_bottleneck(s, hb, q, now, cfg)
    if verdict is not None:
        return verdict
    verdict = _queue_bottleneck(s, hb, q, now, cfg)
    fresh = [r for r in of_heartbeat(hb) if not r.stale()]
    if verdict is None or not fresh:
        return verdict
    code, title, evidence, action = verdict
    extra = _stage_evidence(fresh, *STAGE_SIDES[code])
    return code, title, evidence + (f"; stage times: {extra}" if extra else ""), action


def _queue_bottleneck(
    s: Store, hb: Heartbeat, q: _Queues, now: float, cfg: DiagnosisConfig
) -> tuple[str, str, str, str] | None:
    """The verdict from the queues between the stages: the inference before stage times."""
    pre_empty, hs_empty = q.every(0, _empty(cfg)), q.every(1, _empty(cfg))
    if pre_empty:
        # No input for the targets: whoever idles downstream, prefetch is the cause.
        targets = _idle(s, hb, "target", WAIT_PRE_EMPTY, now, cfg)
        drafters = _idle(s, hb, "drafter", WAIT_HS_EMPTY, now, cfg) if hs_empty else None
        if not (targets or drafters):
            return None
        prefetch = "".join(
            f"; {t.name} '{t.state}' {t.cpu_pct:.0f}% CPU" for t in hb.threads_of("prefetch")
        )
        idle = "; ".join(x for x in (targets, drafters) if x)
        title, action = VERDICTS["prefetch_bottleneck"]
        evidence = f"{q.text(0)} ({q.span()}); {idle}{prefetch}"
        return "prefetch_bottleneck", title, evidence, action
    if hs_empty:
        drafters = _idle(s, hb, "drafter", WAIT_HS_EMPTY, now, cfg)
        if not drafters:
            return None
        title, action = VERDICTS["targets_bottleneck"]
        evidence = f"{drafters}; {q.text(1)} ({q.span()}); {q.text(0)}"
        return "targets_bottleneck", title, evidence, action

    # Drafters too slow: the targets block on q_hs, so q_pre behind them backs up as well.
    def backed_up(depth: int, cap: int) -> bool:
        return depth >= cap * cfg.backed_up_frac

    targets = (
        _idle(s, hb, "target", WAIT_HS_FULL, now, cfg)
        if q.every(1, backed_up) and q.every(0, backed_up)
        else None
    )
    if not targets:
        return None
    title, action = VERDICTS["drafters_bottleneck"]
    return "drafters_bottleneck", title, f"{targets}; {q.text(1)} ({q.span()})", action


@rule
def role_memory_short(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """GPUs of a role (drafter, target) holding much less memory than that role peaked at in
    earlier comparable runs (dflash_tui/facts.py, the number the GPU pane shows too): once
    training, a replica that does its work holds about the same as last time; far less means
    it never got batches or runs another config."""
    if not possible(s, now, cfg).tune:
        return []
    devices = s.gpu_devices()
    expected = expected_memory(s)
    found = []
    for role in ("drafter", "target"):
        usual = expected.get(role)
        if usual is None:
            continue
        peak = usual.usual
        short = [
            (i, float(devices[i].mem_used))
            for i in _role_gpus(s, role, exclusive=True)
            if devices[i].mem_used < cfg.role_memory_frac * peak
        ]
        if not short:
            continue
        who = f"{role}s hold" if len(short) > 1 else f"{role} on GPU {short[0][0]} holds"
        found.append(
            Finding(
                "warning",
                "memory_short",
                f"{who} less memory than usual",
                ", ".join(f"GPU {i} {_gb(m)}" for i, m in short)
                + f"; a {role} peaked at {_gb(peak)} in earlier runs of this config"
                + f" (last: {usual.last_run})",
                f"check the {role}s get batches (queues) and that this run's batch and seq "
                f"buckets match run {usual.last_run}",
            )
        )
    return found


# -- rules: the run's lifetime and its surroundings -----------------------------------------
@rule
def memory_held_after_kill(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """The run is over but processes still hold GPU memory (a child that ignored the kill, a
    zombie with a CUDA context): the next launch would run out of memory. Names the pids."""
    ex = s.exit_info()
    dead = ex is not None or s.process_alive() is False
    devices = s.gpu_devices()
    if not dead or not devices or s.alive_run not in (None, s.run_id):
        return []  # (with another run alive, the memory is that run's)
    hb = s.heartbeat
    ended = (ex.ended_at if ex else None) or (hb.now if hb else None)
    sampled = s.gpu.t if s.gpu else None
    if ended is not None and sampled and sampled < ended + cfg.held_grace_s:
        return []  # the driver frees memory a few seconds after the exit
    used = set(s.gpu_roles()) & set(devices) or set(devices)  # the run's GPUs when known
    trainer = (hb.pid if hb else None) or (s.liveness.pid if s.liveness else None)
    held: dict[int, list[str]] = {}  # pid (0: none visible) -> "79.0 GB on GPU 5"
    remote_pids: set[int] = set()
    for i in sorted(used):
        d = devices[i]
        procs = [p for p in d.processes if p.mem_used >= cfg.held_min_bytes]
        for p in procs:
            held.setdefault(p.pid, []).append(f"{_gb(p.mem_used)} on GPU {i}")
            if not p.local:
                remote_pids.add(p.pid)
        if not procs and d.mem_used >= cfg.held_min_bytes:
            # Inside a container NVML may list no process, or with no memory figure.
            for pid in [p.pid for p in d.processes] or [0]:
                held.setdefault(pid, []).append(f"{_gb(d.mem_used)} on GPU {i}")
    if not held:
        return []
    parts = []
    for pid, where in held.items():
        who = "no visible process" if pid == 0 else f"pid {pid}"
        if trainer is not None and pid == trainer:
            who += " (the trainer)"
        elif pid in remote_pids:
            who += " (not in this container)"
        parts.append(f"{who}: {', '.join(where)}")
    kill = " ".join(str(p) for p in held if p)
    return [
        Finding(
            "warning",
            "memory_held",
            "GPU memory held after the run ended",
            "; ".join(parts),
            (
                f"kill -9 {kill} (on the host for pids not in this container)"
                if kill
                else "find the holder with nvidia-smi on the host"
            )
            + " before relaunching",
        )
    ]


@rule
def slow_phase(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Loading or compiling much longer than the same visit in earlier comparable runs: a
    cleared or invalidated compile cache, a slow disk or network mount, or a thread stuck in
    the phase. Compared with the median of those runs, so one odd run does not set the bar.
    The wait for the target's weights (loading_target#2) is compared as whole loads: the load
    overlaps compiling, so this run's load so far against earlier runs' whole loads."""
    hb = _live(s, now, cfg, LOADING_DATA, LOADING_TARGET, COMPILING)
    got = phase_comparison(s, now) if hb else None
    if hb is not None and got is None:
        return _slower_compile(s, hb, now, cfg)
    if hb is None or got is None or got.key not in SLOW_VISITS or got.so_far is None:
        return []
    elapsed, past = got.so_far, got.earlier
    usual = past.usual
    if elapsed <= cfg.slow_phase_factor * usual or elapsed - usual <= cfg.slow_phase_margin_s:
        return []
    evidence = f"{_dur(elapsed)} so far; {_dur(past.last)} last time (run {past.last_run})"
    if len(past.values) > 1:
        evidence += f", median {_dur(usual)} over {len(past.values)} runs"
    if got.key == TARGET_WAIT:
        evidence = f"the whole load: {evidence}"
    progress = hb.phase_progress
    compiling = compile_progress.detail(hb, s.remote_now(now)) if got.key == COMPILING else None
    if compiling:  # graphs done of expected, the one under way, the cache's last time
        evidence += f"; {compiling}"
    elif progress is not None and progress.total:
        evidence += f"; {progress.done}/{progress.total} {progress.unit}"
    slower = "longer" if got.key == TARGET_WAIT else "slower"
    title = f"{got.doing} {slower} than usual"
    return [Finding("warning", "slow_phase", title, evidence, _slow_action(hb, got.key))]


def _slow_action(hb: Heartbeat, key: str) -> str:
    if key == COMPILING:
        return (
            f"check the compile cache ({hb.compile.cache_dir or 'cache_dir'}) was kept: code "
            "or shape changes recompile everything; dump stacks (d) if it looks stuck"
        )
    return "check the disk or network the files come from; dump stacks (d) to see where it is"


def _slower_compile(s: Store, hb: Heartbeat, now: float, cfg: DiagnosisConfig) -> list[Finding]:
    """No earlier comparable run in the runs list (another run root, or they were deleted),
    but the compile cache remembers what the same graphs took (trainer/runtime/compile/progress.py):
    compiling against that, with the same factor and margin."""
    last = hb.compile.last_s
    if not compile_progress.reported(hb) or last is None or not hb.phase_started_at:
        return []
    elapsed = s.remote_now(now) - hb.phase_started_at
    if elapsed <= cfg.slow_phase_factor * last or elapsed - last <= cfg.slow_phase_margin_s:
        return []
    evidence = f"{_dur(elapsed)} so far; the compile cache's history: " + (
        compile_progress.detail(hb, s.remote_now(now)) or ""
    )
    return [
        Finding(
            "warning",
            "slow_phase",
            "compiling slower than last time",
            evidence,
            _slow_action(hb, COMPILING),
        )
    ]


@rule
def code_mismatch(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The running trainer's code hash differs from what was deployed last: a fix deployed
    after the launch is not running yet (or the run imports another checkout)."""
    hb = s.heartbeat
    deployed = s.hello.deployed if s.hello else None
    if hb is None or deployed is None or s.ended():
        return []
    running, want = hb.code_sha256, deployed.sha256
    if not running or not want or running == want:
        return []
    evidence = f"running {running[:12]}, deployed {want[:12]}"
    if hb.started_at and deployed.at and deployed.at > hb.started_at:
        evidence += f" ({_dur(deployed.at - hb.started_at)} after this run started)"
    return [
        Finding(
            "warning",
            "code_mismatch",
            "running old code",
            evidence,
            "restart (r) to run the deployed code, or redeploy what should run",
        )
    ]


@rule
def recompiles(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """torch.compile compiled graphs after warm-up: every new shape or guard failure stalls
    all threads for seconds to minutes. Says how much the count rose lately (the store's
    heartbeat history)."""
    hb = _live(s, now, cfg, TRAINING)
    if hb is None or hb.compile.recompiles <= 0:
        return []
    comp = hb.compile
    n = comp.recompiles
    points = [(b.now, float(b.compile.recompiles)) for b in _recent(s, hb.now, cfg.rise_window_s)]
    rise, over = _rise(points, n, hb.now, cfg.rise_window_s)
    evidence = f"{n} graphs compiled after warm-up ({comp.graphs} in all)"
    if rise > 0:
        evidence += f", +{rise:.0f} in the last {_dur(over)}"
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


@rule
def mostly_padding(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Most batch positions are padding: the GPUs compute on nothing. Short samples padded to
    a long bucket (chat data without packing: 99 % padding, 200 tok/s instead of 15K, was
    seen on an H200). The heartbeat's `data.padding` is the share over the recent steps."""
    hb = _live(s, now, cfg, TRAINING)
    if hb is None or not possible(s, now, cfg).tune or hb.data is None or hb.data.padding is None:
        return []
    pad = hb.data.padding
    if pad < cfg.padding_frac:
        return []
    if hb.data.packing:
        action = (
            "the samples are few or short for the buckets: add a smaller bucket to"
            " data.seq_buckets, or more data"
        )
    else:
        action = "set data.packing = true (several samples per row, each seeing only itself)"
    return [
        Finding(
            "warning",
            "mostly_padding",
            f"{pad:.0%} of every batch is padding",
            f"{_rate(hb.tok_s)} of real tokens; packing is {'on' if hb.data.packing else 'off'}"
            f" ({hb.data.samples:,} samples, {hb.data.truncated:,} truncated)",
            action,
        )
    ]


@rule
def allocator_retries(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The CUDA caching allocator had to free its cache and retry (num_alloc_retries): memory
    fragmentation, each retry a synchronising stall. Only a rising count matters; a few during
    warm-up are harmless. History: metrics.jsonl's per-step memory and the store's
    heartbeats."""
    hb = _live(s, now, cfg)
    if hb is None:
        return []
    t_now = hb.now
    beats = _recent(s, t_now, cfg.rise_window_s)
    rising: list[tuple[str, int, float, float, DeviceMemory]] = []
    for dev, mem in hb.memory.items():
        cur = mem.alloc_retries
        if cur <= 0:
            continue
        points = [(b.now, float(b.memory[dev].alloc_retries)) for b in beats if dev in b.memory]
        for m in reversed(s.metrics):  # newest first, up to the window's edge
            if t_now - m.time > cfg.rise_window_s:
                break
            if dev in m.memory:
                points.append((m.time, float(m.memory[dev].alloc_retries)))
        rise, over = _rise(points, cur, t_now, cfg.rise_window_s)
        if rise > 0:
            rising.append((dev, cur, rise, over, mem))
    if not rising:
        return []
    return [
        Finding(
            "warning",
            "alloc_retries",
            f"memory fragmentation: allocator retries on {', '.join(r[0] for r in rising)}",
            "; ".join(
                f"{dev}: {cur} retries, +{rise:.0f} in the last {_dur(over)} (reserved "
                f"{_gb(mem.reserved)}, allocated {_gb(mem.allocated)})"
                for dev, cur, rise, over, mem in rising
            ),
            "restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or lower the "
            "batch or the largest seq bucket",
        )
    ]


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


@rule
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


@rule
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


@rule
def disk_short(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The checkpoints still to come will not fit on the run root's disk: each is as large as
    the newest, every one is kept. Critical once the next one alone does not fit (the run
    fails writing it), a warning while a later one will not."""
    hb = s.heartbeat
    host = _host(s, now, cfg)
    run = s.current_run()
    use = run.checkpoints if run is not None else None
    if hb is None or s.ended() or host is None or host.disk is None or use is None:
        return []
    each, free = use.newest_bytes, host.disk.free
    to_come = use.count_to_come(hb.total_steps)
    if each <= 0 or to_come == 0 or free >= to_come * each:
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
    evidence = (
        f"{size(free)} free on {host.disk.path}; the newest checkpoint (step {use.newest_step}) "
        f"is {size(each)}; {to_come} more to come to step {hb.total_steps} ({every}): "
        f"{size(to_come * each)}"
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
            f"disk short: {fit} of {to_come} checkpoints fit",
            evidence,
            f"free {size(to_come * each - free)} under {host.disk.path} (old runs' "
            f"checkpoints) before the checkpoint at step {first_short}",
        )
    ]


@rule
def gil_pressure(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A thread that sleeps 5 ms wakes late when other threads hold the GIL: the pipeline
    threads then wait on Python, not on the GPUs. Sustained over several heartbeats of the
    store's history only, as single spikes are common; and only while a pipeline thread is
    busy on a host with CPUs to spare: on an oversubscribed host every thread wakes late
    waiting for a CPU (host_oversubscribed says so), and threads that are mostly idle hold
    no GIL for long."""
    hb = _live(s, now, cfg, TRAINING)
    if hb is None or not possible(s, now, cfg).tune or _oversubscribed(_host(s, now, cfg), cfg):
        return []
    beats = _recent(s, hb.now, cfg.rise_window_s)[-cfg.gil_beats :]
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


def _recent_rates(s: Store, cfg: DiagnosisConfig) -> tuple[list[float], str]:
    """The last logged steps' tok/s (metrics rows, else step lines, else the heartbeat's)."""
    n = cfg.rate_samples
    rates = [v for m in list(s.metrics)[-n:] if (v := finite(m.tok_s)) is not None]
    if rates:
        return rates, "logged steps"
    rates = [x.tok_s for x in list(s.step_lines)[-n:]]
    if rates:
        return rates, "step lines"
    hb = s.heartbeat
    return ([hb.tok_s], "heartbeat") if hb and hb.tok_s else ([], "")


def _preflight(s: Store) -> Preflight | None:
    """The followed run's fast-kernel preflight: the heartbeat's, else config.json's."""
    if s.heartbeat is not None and s.heartbeat.preflight is not None:
        return s.heartbeat.preflight
    cur = s.current_run()
    return cur.preflight if cur else None


@rule
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


@rule
def environment_changed(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """This run trains more slowly than the last earlier comparable run (same config
    signature, trainer/contract/comparable.py) and its environment differs from that run's:
    name what differs ("transformers 5.17.0 → 5.24.0, fla missing")."""
    hb = s.heartbeat
    if hb is not None and not possible(s, now, cfg).tune:
        return []
    rates, _source = _recent_rates(s, cfg)
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
            f"{_rate(current)} tok/s now; run {change.run.run_id} (same config) trained at "
            f"{_rate(change.tok_s)} tok/s on: {before}",
            f"put back what differs ({what}), or compare the two runs' config.json run.environment",
        )
    ]


# -- GPU health ------------------------------------------------------------------------------
@dataclass
class _Clocks:
    """One GPU of the run over the throttle window: what NVML said in its samples."""

    index: int
    role: str
    samples: int  # samples with clock reasons
    span_s: float
    slowdown: float  # share of them with a fault reason (thermal, HW slowdown, power brake)
    capped: float  # share with the power cap
    limited: float  # share with any reason that holds the clock (not idle)
    reasons: int  # every reason bit seen
    clock: float | None  # median SM clock, MHz
    max_clock: int | None
    power_limit_w: float | None
    temp_c: int | None

    def ghz(self) -> str:
        if self.clock is None:
            return "SM clock ?"
        top = f" of {self.max_clock / 1000:.2f}" if self.max_clock else ""
        return f"{self.clock / 1000:.2f}{top} GHz"

    def peer_key(self) -> str:
        """GPUs doing the same work: the models they hold (prefetch and eval ride along)."""
        parts = [r for r in self.role.split("+") if r in ("target", "drafter")]
        return "+".join(parts) or self.role


# Reasons that hold a busy GPU's clock down (any but idle and the display clock).
CLOCK_HOLDS = CLOCK_SLOWDOWNS | CLOCK_POWER_CAP | CLOCK_APP_SETTING | CLOCK_SYNC_BOOST


def _gpu_clocks(s: Store, now: float, cfg: DiagnosisConfig) -> list[_Clocks]:
    since = s.remote_now(now) - cfg.throttle_window_s
    devices = s.gpu_devices()
    out = []
    for index, role in sorted(s.gpu_roles().items()):
        pts = [
            p for p in s.gpu_history.get(index, ()) if p.t >= since and p.clock_reasons is not None
        ]
        if len(pts) < cfg.throttle_min_samples or index not in devices:
            continue
        reasons = [p.clock_reasons or 0 for p in pts]
        # An idle GPU drops its clock by design: only busy samples say how fast it runs.
        clocks = [
            p.sm_clock_mhz
            for p in pts
            if p.sm_clock_mhz is not None and not (p.clock_reasons or 0) & CLOCK_IDLE
        ]
        d = devices[index]
        out.append(
            _Clocks(
                index=index,
                role=role,
                samples=len(pts),
                span_s=pts[-1].t - pts[0].t,
                slowdown=sum(1 for r in reasons if r & CLOCK_SLOWDOWNS) / len(pts),
                capped=sum(1 for r in reasons if r & CLOCK_POWER_CAP) / len(pts),
                limited=sum(1 for r in reasons if r & CLOCK_HOLDS) / len(pts),
                reasons=_or_all(reasons),
                clock=float(statistics.median(clocks)) if clocks else None,
                max_clock=d.sm_clock_max_mhz,
                power_limit_w=d.power_limit_w,
                temp_c=d.temp_c,
            )
        )
    return out


def _or_all(values: Iterable[int]) -> int:
    out = 0
    for v in values:
        out |= v
    return out


def _peers(g: _Clocks, all_: list[_Clocks]) -> list[_Clocks]:
    return [p for p in all_ if p.index != g.index and p.peer_key() == g.peer_key()]


def _below_peers(g: _Clocks, all_: list[_Clocks], cfg: DiagnosisConfig) -> float | None:
    """Its peers' median SM clock when `g` runs `clock_gap_frac` or more below it."""
    peer_clocks = [p.clock for p in _peers(g, all_) if p.clock is not None]
    if g.clock is None or not peer_clocks:
        return None
    peer = float(statistics.median(peer_clocks))
    return peer if g.clock <= peer * (1.0 - cfg.clock_gap_frac) else None


def _reasons(bits: int) -> str:
    return ", ".join(clock_reason_names(bits) or []) or "?"


def _throttle_text(g: _Clocks, share: float, bits: int) -> str:
    """`GPU 6 (drafter) 1.70 of 1.98 GHz, power cap in 100% of 12 samples over 1m50s`."""
    return (
        f"GPU {g.index} ({g.role}) {g.ghz()}, {_reasons(bits)} in {share:.0%} of {g.samples} "
        f"samples over {_dur(g.span_s)}"
    )


@rule
def gpu_throttled(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A GPU of the training run held below its clocks for a sustained share of the recent
    samples. Heat, the board's slowdown signal or a power brake: warning. The power cap on
    its own is what a sustained load normally runs into (an H200 training ran power-capped in
    91-100 % of samples): info, unless that GPU runs well below its peers of the same role,
    which the replicas' step (or the targets' feed) then waits for: warning; so is one held
    below its peers by clocks set or locked lower (application clocks) or sync boost."""
    if _live(s, now, cfg, TRAINING) is None:
        return []
    gpus = _gpu_clocks(s, now, cfg)
    warn: list[tuple[int, str, str, str]] = []  # (rank: worst first, title, evidence, action)
    capped: list[_Clocks] = []
    for g in gpus:
        peer = _below_peers(g, gpus, cfg)
        peers_text = ""
        if peer is not None:
            names = ", ".join(str(p.index) for p in _peers(g, gpus))
            peers_text = f"; its {g.peer_key()} peers (GPU {names}) run at {peer / 1000:.2f} GHz"
        if g.slowdown >= cfg.throttle_share:
            thermal = g.reasons & (CLOCK_HW_THERMAL | CLOCK_SW_THERMAL)
            temp = f", {g.temp_c}C" if g.temp_c is not None and thermal else ""
            text = _throttle_text(g, g.slowdown, g.reasons & CLOCK_SLOWDOWNS) + temp + peers_text
            if thermal:
                action = (
                    f"check GPU {g.index}'s cooling (fans, airflow, inlet temperature): "
                    f"nvidia-smi -i {g.index} -q -d PERFORMANCE,TEMPERATURE"
                )
            elif g.reasons & (CLOCK_HW_SLOWDOWN | CLOCK_POWER_BRAKE):
                action = (
                    f"check GPU {g.index}'s power supply and board (nvidia-smi -i {g.index} "
                    "-q -d PERFORMANCE names the slowdown); move the run off it if it persists"
                )
            else:
                action = f"see nvidia-smi -i {g.index} -q -d PERFORMANCE"
            title = f"GPU {g.index} throttled: {_reasons(g.reasons & CLOCK_SLOWDOWNS)}"
            warn.append((0 if thermal else 1, title, text, action))
        elif g.limited >= cfg.throttle_share and peer is not None:
            if g.capped >= cfg.throttle_share:
                limits = [p.power_limit_w for p in _peers(g, gpus) if p.power_limit_w is not None]
                limit = ""
                if g.power_limit_w is not None:
                    limit = f", limit {g.power_limit_w:.0f} W"
                    if limits and max(limits) > g.power_limit_w:
                        limit += f" (peers' {max(limits):.0f} W)"
                text = _throttle_text(g, g.capped, CLOCK_POWER_CAP) + limit
                action = (
                    f"compare GPU {g.index}'s power limit with its peers' "
                    f"(nvidia-smi -q -d POWER); raise it with nvidia-smi -i {g.index} -pl WATTS"
                )
                title = f"GPU {g.index} power-capped below its peers: {g.ghz()}"
            else:  # clocks set or locked lower (nvidia-smi -ac/-lgc), or held by sync boost
                text = _throttle_text(g, g.limited, g.reasons & CLOCK_HOLDS)
                action = (
                    f"reset GPU {g.index}'s clocks to the default: nvidia-smi -i {g.index} -rgc "
                    "and -rac (or set its peers' clocks)"
                )
                title = f"GPU {g.index} clocked below its peers: {g.ghz()}"
            warn.append((2, title, text + peers_text, action))
        elif g.capped >= cfg.throttle_share:
            capped.append(g)
    if warn:
        warn.sort(key=lambda w: w[0])
        shown = [w[2] for w in warn[:3]] + ([f"{len(warn) - 3} more"] if len(warn) > 3 else [])
        _, title, _, action = warn[0]
        return [Finding("warning", "gpu_throttled", title, "; ".join(shown), action)]
    if capped:
        share = min(g.capped for g in capped)
        which = ", ".join(str(g.index) for g in capped)
        clocks = ", ".join(f"{g.index} {g.ghz()}" for g in capped[:8])
        return [
            Finding(
                "info",
                "gpu_throttled",
                f"GPU {which} power-capped",
                f"power cap in {share:.0%}+ of the last {_dur(cfg.throttle_window_s)}'s samples "
                f"(SM clocks: {clocks}); no GPU below its peers: normal under sustained load",
                "nothing to do; a GPU that falls below its peers' clock is said as a warning",
            )
        ]
    return []


@rule
def gpu_ecc_errors(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A GPU of the run counted new uncorrected ECC errors (NVML's volatile count) since the
    run started: its memory returned wrong data, so the run's numbers on it cannot be
    trusted, and CUDA usually kills the process that hit it. The count resets when the
    driver reloads: only rises count. Said also after the run ended (it explains a crash)."""
    hb = s.heartbeat
    if hb is None:
        return []
    bad: list[int] = []
    parts: list[str] = []
    for index, role in sorted(s.gpu_roles().items()):
        pts = [
            (p.t, p.ecc_uncorrected)
            for p in s.gpu_history.get(index, ())
            if p.t >= hb.started_at and p.ecc_uncorrected is not None
        ]
        rise = sum(max(0, b - a) for (_, a), (_, b) in itertools.pairwise(pts))
        if rise >= cfg.ecc_rise_min:
            bad.append(index)
            parts.append(
                f"GPU {index} ({role}): +{rise} uncorrected ECC errors during the run "
                f"({pts[0][1]} -> {pts[-1][1]} over {_dur(pts[-1][0] - pts[0][0])} of samples, "
                "NVML's volatile count)"
            )
    if not bad:
        return []
    which = ", ".join(str(i) for i in bad)
    return [
        Finding(
            "critical",
            "gpu_ecc_errors",
            f"GPU {which}: uncorrected memory errors",
            "; ".join(parts),
            f"stop the run and resume from the last good checkpoint without GPU {which} "
            "(CUDA_VISIBLE_DEVICES); nvidia-smi -q -d ECC,ROW_REMAPPER says if it needs a reset",
        )
    ]


@rule
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
    rates, source = _recent_rates(s, cfg)
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
            f"tok/s {deficit:.0f}% below the {_rate(base)} baseline",
            f"{_rate(current)} tok/s ({how}) vs {_rate(base)}; more than {cfg.slow_pct:.0f}% below",
            "compare GPU use per role, queue depths and GIL with the baseline run",
        )
    ]


# -- wandb ----------------------------------------------------------------------------------
_WANDB_RUN_URL = re.compile(r"View run at (https?://\S+/runs/([A-Za-z0-9]+))")
_WANDB_RUN_DIR = re.compile(r"run-\d{8}_\d{6}-([A-Za-z0-9]+)")
_WANDB_OFFLINE = re.compile(r"syncing is set to\W+offline|wandb sync ", re.IGNORECASE)


def _wandb_lines(s: Store) -> list[str]:
    return [ln for ln in s.log_lines if ln.startswith("wandb:")]


def wandb_info(s: Store) -> WandbInfo | None:
    """The run's wandb run: from the heartbeat, else from the `wandb:` lines wandb printed
    into train.log ("View run at https://wandb.ai/…/runs/<id>"). `mode` is "" when neither
    says it."""
    hb_w = s.heartbeat.wandb if s.heartbeat else None
    if hb_w is not None and (hb_w.id or hb_w.url):
        return hb_w
    run_id: str | None = None
    url: str | None = None
    mode: str | None = None
    for ln in _wandb_lines(s):
        if m := _WANDB_RUN_URL.search(ln):
            url, run_id, mode = m.group(1), m.group(2), "online"
        elif (m := _WANDB_RUN_DIR.search(ln)) and not run_id:
            run_id = m.group(1)
        if _WANDB_OFFLINE.search(ln):
            mode = "offline"
    if run_id or url:
        return WandbInfo(mode=mode or (hb_w.mode if hb_w else ""), id=run_id, url=url)
    return hb_w


@rule
def no_step_line_yet(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """train.log shows wandb's start-up lines and no step line: readers guess between "still
    loading" and "training". Say the heartbeat's phase, how long it has been in it, and
    whether steps advance; name the wandb run."""
    hb = s.heartbeat
    wandb_lines = _wandb_lines(s)
    if hb is None or not s.follow_received or s.step_lines or not wandb_lines or s.ended():
        return []
    age = _phase_age(s, now)
    in_phase = f"{hb.phase} for {_dur(age)}" if age is not None else hb.phase
    expect = phase_expectation(s, now)
    wb = wandb_info(s)
    run = f"; wandb run {wb.id} ({wb.mode or '?'})" if wb and wb.id else ""
    log = f"train.log: {len(wandb_lines)} wandb lines, no step line"
    if hb.step > 0 and hb.last_step_at is not None:
        ago = _dur(s.remote_now(now) - hb.last_step_at)
        return [
            Finding(
                "info",
                "no_step_line",
                f"{in_phase}, step {hb.step}, no step line yet",
                f"heartbeat: {in_phase}, steps advance (step {hb.step}, last {ago} ago); "
                f"{log}{run}",
                "training runs; step lines appear at the first logged step unless stdout is "
                "buffered",
            )
        ]
    return [
        Finding(
            "info",
            "no_step_line",
            f"{in_phase}, no step yet",
            f"heartbeat: {in_phase}" + (f" ({expect})" if expect else "") + f", step {hb.step}; "
            f"{log}{run}",
            "not training yet: wandb prints at start-up; wait for the phase to end",
        )
    ]


# -- rules: held-out τ ----------------------------------------------------------------------
def _since_best(info: EvalInfo) -> tuple[EvalPoint, list[EvalPoint]] | None:
    """(this run's best eval, the scored evals after it), None before any eval has a τ."""
    best = info.best()
    if best is None:
        return None
    return best, [p for p in evaluation.scored(info) if p.step > best.step]


def _fall(best: EvalPoint, latest: EvalPoint) -> float:
    """How far `latest`'s τ is below the best's, as a share of the best."""
    top = best.tau or 0.0
    return (top - (latest.tau or 0.0)) / top if top > 0 else 0.0


def _acc_rise(best: EvalPoint, latest: EvalPoint) -> float | None:
    if best.train_acc is None or latest.train_acc is None:
        return None
    return latest.train_acc - best.train_acc


def _overfit(best: EvalPoint, latest: EvalPoint, cfg: DiagnosisConfig) -> bool:
    rise = _acc_rise(best, latest)
    return _fall(best, latest) >= cfg.tau_noise_frac and (rise or 0.0) >= cfg.overfit_acc_rise


def _export_best(best: EvalPoint) -> str:
    """Checkpoints are not written at each eval: the one nearest the best step."""
    return f"export the checkpoint nearest step {best.step}, the best (dflash-tui export --step S)"


@rule
def eval_failed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The eval thread says its last eval failed (`EvalInfo.error`, the host's words): the
    run trains on, but nothing measures the drafter any more."""
    info = s.eval_info()
    if info is None or info.error is None:
        return []
    latest = next(reversed(evaluation.scored(info)), None)
    before = f"; the last τ {latest.tau:.2f} at step {latest.step}" if latest else ""
    return [
        Finding(
            "warning",
            "eval_failed",
            "held-out eval failed",
            f"{info.error}{before}",
            "training goes on unmeasured: read train.log's `eval:` lines; a failed eval is "
            "tried again at the next, one turned off is not (out of memory: fewer "
            "eval.prompts or eval.new_tokens)",
        )
    ]


@rule
def overfitting(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Held-out τ fell below its best by more than noise while the training accuracy rose
    over the same steps: the drafter learns the training samples, not the target. Said also
    once the run ended: which step to export is the question then."""
    info = s.eval_info()
    got = _since_best(info) if info is not None else None
    if got is None or not got[1]:
        return []
    best, after = got
    latest = after[-1]
    if not _overfit(best, latest, cfg):
        return []
    fall = _fall(best, latest)
    acc = f"{best.train_acc or 0.0:.1%} → {latest.train_acc or 0.0:.1%}"
    if not possible(s, now, cfg).signal:
        action = f"{_export_best(best)}, not the newest; next time more data or fewer epochs"
    else:
        action = (
            f"stop it (k) and {_export_best(best)}: more steps fit the training data; "
            "more data or fewer epochs"
        )
    return [
        Finding(
            "critical" if fall >= cfg.overfit_critical_frac else "warning",
            "overfitting",
            f"held-out τ fell {fall:.0%} from its best while training acc rose",
            f"τ {latest.tau:.2f} at step {latest.step}, best {best.tau:.2f} at step {best.step}"
            f" ({len(after)} evals since); training acc {acc} over the same "
            f"{latest.step - best.step} steps",
            action,
        )
    ]


@rule
def eval_plateau(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Held-out τ has not beaten its best for `plateau_evals` evals while the run trains on:
    the steps buy nothing the target accepts. Quiet when `overfitting` says more."""
    hb = _live(s, now, cfg, TRAINING, CHECKPOINTING)
    got = _since_best(hb.eval) if hb is not None and hb.eval is not None else None
    if got is None or len(got[1]) < cfg.plateau_evals:
        return []
    best, after = got
    latest = after[-1]
    if _overfit(best, latest, cfg):
        return []
    taus = [p.tau or 0.0 for p in after]
    rise = _acc_rise(best, latest)
    acc = f"; training acc {rise:+.1%} over them" if rise is not None else ""
    return [
        Finding(
            "warning",
            "eval_plateau",
            f"held-out τ no better than {best.tau:.2f} for {len(after)} evals",
            f"best τ {best.tau:.2f} at step {best.step}; the {len(after)} evals since (steps "
            f"{after[0].step}–{latest.step}) {min(taus):.2f}–{max(taus):.2f}, latest "
            f"{latest.tau:.2f}{acc}",
            f"{_export_best(best)} and stop, or change what it learns: the target's own "
            "answers (python -m trainer regenerate), more data, a lower lr",
        )
    ]


@rule
def eval_skipped(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Evals fell due while one was still under way and were not run (the pipeline never
    waits for the eval thread): τ is measured less often than `eval.every` says."""
    info = s.eval_info()
    if info is None or info.skipped == 0:
        return []
    # The mean, not the last: a run's final eval may be far shorter (it decodes on an idle
    # GPU) and say "0s" of evals that each outlasted eval.every.
    done = len(info.history)
    if done:
        took = f"; {done} ran, {_dur(info.seconds / done)} each on average"
    elif info.running_step is not None:
        took = f"; none has finished yet (step {info.running_step}'s is still running)"
    else:
        took = ""
    return [
        Finding(
            "info",
            "eval_skipped",
            f"{info.skipped} held-out evals skipped",
            f"an eval every {info.every} steps, each still running when the next was due{took}"
            f" ({info.prompts} prompts × {info.new_tokens} new tokens on {info.device or '?'})",
            "raise eval.every, or lower eval.prompts or eval.new_tokens",
        )
    ]


# -- rules: baselines --
def _own_drop(s: Store, cfg: DiagnosisConfig) -> OwnDrop | None:
    return own_drop(s, cfg.drop_skip_rows, cfg.drop_rows, cfg.drop_min_stable, cfg.drop_pct)


@rule
def throughput_drop(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """tok/s fell and stayed down against the run's own stable median: every logged step of
    a stretch of at least drop_rows more than drop_pct below the median of the steps before
    it (throughput_history.own_drop), since which step said. Off when baseline_tok_s is set."""
    if cfg.baseline_tok_s or not _live(s, now, cfg, TRAINING):
        return []
    got = _own_drop(s, cfg)
    if got is None:
        return []
    return [
        Finding(
            "warning",
            "throughput_drop",
            f"tok/s down {got.drop_pct:.0f}% from this run's own baseline",
            f"{_rate(got.recent_tok_s)} tok/s (median of the last {got.recent_rows} logged"
            f" steps) vs {_rate(got.stable_tok_s)} (median of the {got.stable_rows} logged"
            f" steps before); every logged step since step {got.slow_since} more than"
            f" {cfg.drop_pct:.0f}% below",
            f"compare GPU use per role, queue depths and stage times with before step"
            f" {got.slow_since}",
        )
    ]


@rule
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
    if cfg.baseline_tok_s or not _live(s, now, cfg, TRAINING):
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
            f"{_rate(current)} tok/s (median of the last {len(recent)} logged steps, the"
            f" fastest {_rate(max(recent))}) vs {_rate(best.tok_s)}, the best of run"
            f" {best.run_id} (same shape and layout); every one more than"
            f" {cfg.earlier_pct:.0f}% below",
            f"compare this run's GPU use, queues and stage times with run {best.run_id}",
        )
    ]


def config_for(extra: dict[str, Any]) -> DiagnosisConfig:
    """The thresholds a named target sets in ~/.config/dflash-tui/config.toml."""
    baseline = extra.get("baseline_tok_s")
    if baseline is None:
        return DEFAULT_CONFIG
    return replace(DEFAULT_CONFIG, baseline_tok_s=float(baseline))


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
