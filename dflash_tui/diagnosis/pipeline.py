"""Rules of the pipeline and its queues: a stuck target, the bottleneck (from stage times or
queue depths), batches of mostly padding."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dflash_tui.diagnosis.common import (
    dur,
    live_heartbeat,
    mean_util,
    possible,
    recent_heartbeats,
    role_gpus,
    tok_rate,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.stages import (
    ThreadStages,
    busiest,
    ms_text,
    of_heartbeat,
    of_role,
    thread_stages,
)
from dflash_tui.state import Store
from trainer.contract.heartbeat import (
    STAGE_CHECKPOINT,
    STAGE_HOST,
    STAGE_OPTIMIZER,
    STAGE_WAIT_HS,
    STAGE_WAIT_PRE,
    STAGE_WAIT_REPLICAS,
    WAIT_HS_EMPTY,
    WAIT_HS_FULL,
    WAIT_PRE_EMPTY,
    Heartbeat,
    ThreadInfo,
)
from trainer.contract.phases import (
    TRAINING,
)


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
        return "1 sample" if n == 1 else f"all {n} samples over {dur(self.span_s)}"


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
    gpus = role_gpus(s, role, exclusive=True)
    if gpus:
        utils = {i: mean_util(s, i, now, cfg) for i in gpus}
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
        + f" for {dur(waited)}+"
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
    utils = {i: mean_util(s, i, now, cfg) for i in role_gpus(s, role, exclusive=True)}
    known = {i: u for i, u in utils.items() if u is not None}
    return f"{role} GPUs " + ", ".join(f"{i} {u:.0f}%" for i, u in known.items()) if known else ""


# -- rules: the pipeline --------------------------------------------------------------------
@rule(
    Code("target_stuck", ("warning",), "a target with a full q_pre does no work"),
    reads="the heartbeat's queues and target threads (state, time in it, stage times), "
    "metrics.jsonl's queue depths, the GPU samples' utilisation",
    decides="Training, a fresh heartbeat. For each q_pre at least `queue_full_frac` full in "
    "every sample of the last `queue_window_s` (shared routing: the one q_pre, for each "
    "target thread), whose target thread is not waiting on a full "
    "q_hs (then the drafters are slow): with a GPU, the GPU's mean utilisation over "
    "`util_window_s` at or below `idle_util_pct` and the thread in one state for "
    "`util_window_s` or more; without one, the thread busy (not waiting) in one state for "
    "`stuck_s`, or with stage times for `stuck_loops` of its loops (at least `stuck_min_s`).",
    thresholds=(
        "stale_factor",
        "queue_window_s",
        "queue_full_frac",
        "util_window_s",
        "idle_util_pct",
        "stuck_s",
        "stuck_loops",
        "stuck_min_s",
    ),
    action="dump stacks (d) to see where the target thread waits",
)
def stuck_target(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A target with a full q_pre that does not work: its thread in one state all along while
    its GPU sat idle over the same window (or, without GPUs, in one busy state for a minute;
    with stage times, for `stuck_loops` of its loops, at least `stuck_min_s`).
    It has input and room for output (unless it waits on a full q_hs: then the drafters are
    slow, not it), so its thread is stuck. A small model keeps its GPU near idle while its
    thread cycles through its states every few milliseconds: that is not stuck."""
    hb = live_heartbeat(s, now, cfg, TRAINING)
    q = _queues(s, hb, now, cfg) if hb else None
    if hb is None or q is None:
        return []
    threads = hb.threads_of("target")
    by_name = {t.name: t for t in threads}
    stuck: list[tuple[int, str]] = []
    feeds: list[tuple[int, int, ThreadInfo | None]]
    if hb.queues.shared:  # one q_pre feeds every target thread: (queue 0, target i)
        feeds = [(0, i, th) for i, th in enumerate(threads)]
    else:  # q_pre[i] feeds thread target-i (trainer/runtime/pipeline.py); else the i-th
        feeds = [
            (i, i, by_name.get(f"target-{i}") or (threads[i] if i < len(threads) else None))
            for i in range(len(q.pre_cap))
        ]
    for qi, i, th in feeds:
        if not q.every(0, lambda d, c: d >= c * cfg.queue_full_frac, qi):
            continue
        if th is not None and th.state == WAIT_HS_FULL:
            continue
        row = thread_stages(hb, th) if th is not None else None
        if th is None:
            name, doing, gpu = f"target {i}", "no thread info", None
        else:
            name, doing = th.name, f"'{th.state}' for {dur(hb.in_state_s(th))}"
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
            util = mean_util(s, gpu, now, cfg)
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
    full = q.text(0) + " (shared by every target)" if hb.queues.shared else q.text(0, ids)
    return [
        Finding(
            "warning",
            "target_stuck",
            f"{who} idle with a full q_pre",
            "; ".join(e for _, e in stuck) + f"; {full} ({q.span()})",
            f"dump stacks (d) to see where {stuck[0][1].split()[0]} waits",
        )
    ]


@rule(
    Code("prefetch_bottleneck", ("warning",), "data prefetch starves the targets"),
    Code("targets_bottleneck", ("warning",), "the targets starve the drafters"),
    Code("drafters_bottleneck", ("warning",), "the drafters hold the targets back"),
    Code("host_bottleneck", ("warning",), "a role's own GPUs wait for its Python thread"),
    reads="the heartbeat's stage times, queues and threads; metrics.jsonl's queue depths; GPU "
    "utilisation; the prefetch threads' CPU over the store's recent heartbeats",
    decides="Only while the pipeline trains (a fresh training heartbeat, a step within "
    "`stall_s`, no graph compiling), and only when the starved side really idles. From stage "
    "times where the heartbeat has them: a role whose threads wait `stage_wait_frac` or more "
    "of their loop on one queue is starved by the role upstream (targets on q_pre: prefetch; "
    "drafters on q_hs: the targets; targets on a full q_hs: the drafters); idle means on GPUs "
    "of its own that wait, else every thread of the role blocked for `starved_s`. GPUs of "
    "its own waiting `stage_wait_frac` on the host: host_bottleneck. Without stage times, "
    "from the queues over `queue_window_s`: q_pre at or below `queue_empty_frac` in every "
    "sample (prefetch); q_hs that empty with idle drafters (targets); q_hs and q_pre at "
    "least `backed_up_frac` full with idle targets (drafters); idle GPUs being a mean "
    "utilisation at or below `idle_util_pct` over `util_window_s`. prefetch_bottleneck's "
    "advice follows the prefetch threads' mean CPU: under `prefetch_cpu_bound_pct` they "
    "wait on I/O rather than compute.",
    thresholds=(
        "stale_factor",
        "stall_s",
        "stage_wait_frac",
        "starved_s",
        "queue_window_s",
        "queue_empty_frac",
        "backed_up_frac",
        "idle_util_pct",
        "util_window_s",
        "prefetch_cpu_bound_pct",
    ),
    action="prefetch: add prefetch threads or make batch building cheaper (when they wait "
    "instead: check the data source and its disk). Targets: more GPUs for the targets or "
    "fewer for the drafters. Drafters: more drafter replicas or less work per batch. Host: "
    "fewer, larger kernels (train.compile_drafter, a larger batch); check GIL pressure.",
)
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
    hb = live_heartbeat(s, now, cfg, TRAINING) if possible(s, now, cfg).tune else None
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
    beats = [*recent_heartbeats(s, hb.now, cfg.util_window_s), hb]
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


@rule(
    Code("mostly_padding", ("warning",), "most of every batch is padding"),
    reads="the heartbeat's data: padding share over the recent steps, packing, samples",
    decides="While the pipeline trains (a fresh training heartbeat, a step within `stall_s`, "
    "nothing compiling), the padding share is `padding_frac` or more.",
    thresholds=("stale_factor", "stall_s", "padding_frac"),
    action="packing off: set data.packing = true. Packing on: the samples are few or short "
    "for the buckets: add a smaller bucket to data.seq_buckets, or more data.",
)
def mostly_padding(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Most batch positions are padding: the GPUs compute on nothing. Short samples padded to
    a long bucket (chat data without packing: 99 % padding, 200 tok/s instead of 15K, was
    seen on an H200). The heartbeat's `data.padding` is the share over the recent steps."""
    hb = live_heartbeat(s, now, cfg, TRAINING)
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
            f"{tok_rate(hb.tok_s)} of real tokens; packing is {'on' if hb.data.packing else 'off'}"
            f" ({hb.data.samples:,} samples, {hb.data.truncated:,} truncated)",
            action,
        )
    ]


# -- threads mode: a straggling target or replica -------------------------------------------
# A drafter's own work per step: replica 0 also steps the optimizer and copies checkpoints
# for all of them, which is no sign of a slow replica.
_SHARED_WORK = (STAGE_OPTIMIZER, STAGE_CHECKPOINT)


# Which waits of the other threads a slow thread of a role causes: {straggler's role:
# {waiting thread's role: its stages}}. A slow target leaves the drafters without features
# (and, fixed, the other replicas at the barrier) and the other targets' q_hs full behind
# replicas held at the barrier; a slow drafter holds the others at the barrier and the
# targets at a full q_hs. A drafter waiting on q_hs is no sign of a slow drafter.
_CAUSED: dict[str, dict[str, tuple[str, ...]]] = {
    "target": {"drafter": (STAGE_WAIT_HS, STAGE_WAIT_REPLICAS), "target": (STAGE_WAIT_HS,)},
    "drafter": {"drafter": (STAGE_WAIT_REPLICAS,), "target": (STAGE_WAIT_HS,)},
}


def _compute_ms(row: ThreadStages) -> float:
    return sum(st.ms for st in row.stages if not st.wait and st.name not in _SHARED_WORK)


def _waits_on(row: ThreadStages, slow_role: str) -> float:
    """The share of `row`'s loop spent in the waits a slow `slow_role` thread causes."""
    stages = _CAUSED[slow_role].get(row.role, ())
    return sum(row.ms(st) for st in stages) / row.period_ms if row.period_ms > 0 else 0.0


@rule(
    Code(
        "thread_straggler",
        ("warning",),
        "threads mode: one target or drafter thread computes slower than its peers and the "
        "others wait",
    ),
    reads="the heartbeat's per-thread stage times (ThreadInfo.stages_ms) and queues' routing",
    decides="While the pipeline trains (a fresh training heartbeat, a step within `stall_s`, "
    "nothing compiling), at least `rank_min_steps` steps in, every target and drafter thread "
    "timed and none in one state for much longer than its loop. A target or drafter thread "
    "whose compute per loop (its stages other than waits; a drafter's without the optimizer "
    "and checkpoint, replica 0's share of the step) is at least `straggler_factor` × the "
    "median of its same-role peers' and `straggler_min_ms` above it, while at least half of "
    "the other target and drafter threads spend `rank_wait_frac` or more of their loop in "
    "the waits it causes (a slow target: drafters on q_hs or at the step's barrier, targets "
    "on a full q_hs; a slow drafter: drafters at the barrier, targets on a full q_hs).",
    thresholds=(
        "stale_factor",
        "stall_s",
        "rank_min_steps",
        "straggler_factor",
        "straggler_min_ms",
        "rank_wait_frac",
    ),
    action='fixed routing: runtime.routing = "shared" lets the other threads take its '
    "batches. Either way, check that thread's device (its clocks, other processes on it).",
)
def thread_straggler(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """threads mode: one target (or drafter replica) thread takes well longer per batch than
    its same-role peers while the others wait, as `rank_straggler` says of a processes-mode
    rank. Under fixed routing every replica waits for its batches in turn; under shared
    the others take its share, and what is left is its own slowness."""
    hb = live_heartbeat(s, now, cfg, TRAINING) if possible(s, now, cfg).tune else None
    if hb is None or hb.step < cfg.rank_min_steps:
        return []
    rows = [r for r in of_heartbeat(hb) if r.role in ("target", "drafter")]
    if not rows or any(r.stale() for r in rows):
        return []
    found = []
    for row in rows:
        peers = [p for p in of_role(rows, row.role) if p is not row]
        if not peers:
            continue
        peers_ms = statistics.median(_compute_ms(p) for p in peers)
        mine = _compute_ms(row)
        if mine < cfg.straggler_factor * peers_ms or mine - peers_ms < cfg.straggler_min_ms:
            continue
        others = [o for o in rows if o is not row]
        waiting = sorted(
            (o for o in others if _waits_on(o, row.role) >= cfg.rank_wait_frac),
            key=lambda o: -_waits_on(o, row.role),
        )
        if 2 * len(waiting) < len(others):
            continue
        whose = (
            f"the median of its {len(peers)} {row.role} peers'"
            if len(peers) > 1
            else (f"its {row.role} peer's")
        )
        waits = ", ".join(f"{o.name} {_waits_on(o, row.role):.0%}" for o in waiting[:4])
        routing = "shared" if hb.queues.shared else "fixed"
        fix = (
            'runtime.routing = "shared" lets the other threads take its batches; '
            if routing == "fixed"
            else ""
        )
        factor = mine / peers_ms if peers_ms > 0 else float("inf")
        found.append(
            Finding(
                "warning",
                "thread_straggler",
                f"{row.name} is a straggler on {row.device}",
                f"{ms_text(mine)} of compute per {row.loop} vs {ms_text(peers_ms)}, {whose} "
                f"({factor:.1f}x); the others wait: {waits}"
                f"{', …' if len(waiting) > 4 else ''} of their loops; routing {routing}",
                f"{fix}check {row.device} (its clocks and throttling, other processes on it)",
            )
        )
    return found
