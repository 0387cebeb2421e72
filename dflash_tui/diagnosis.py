"""Diagnosis: rules that read the store and say what is wrong, with evidence and a fix.

Pure Python, shared by the headless view and the TUI. Each rule is a function of the store,
the time and a `DiagnosisConfig`, returning findings; `diagnose()` runs them all, most severe
first (rules of one severity keep their registration order: causes before symptoms).

Rules read the store's current snapshot. History comes from what the store keeps
(metrics.jsonl records, GPU samples, the runs list with earlier runs' phase times and memory)
and, for the few heartbeat counters that no file records (GIL lateness, recompiles), from a
small per-store memo of the heartbeats `diagnose()` has seen: views call it on every redraw.
"""

from __future__ import annotations

import math
import re
import statistics
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from dflash_tui.fmt import duration, rate
from dflash_tui.state import Store
from trainer.contract.phases import FINAL_PHASES

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEARTBEAT_MAX_INTERVAL_S = 2.0  # the contract: replaced every <= 2 s
GIB = 1 << 30

# Thread states the pipeline writes while it blocks on a queue (trainer/pipeline.py).
WAIT_PRE_EMPTY = "waiting: q_pre empty"
WAIT_HS_EMPTY = "waiting: q_hs empty"
WAIT_HS_FULL = "waiting: q_hs full"

# Phases in the order a healthy run walks them: a phase counts as done once a later one began.
PROGRESSION = ("starting", "loading_target", "loading_data", "compiling", "warmup", "training")
SLOW_PHASES = {  # phase -> how a title names it
    "loading_target": "loading the target",
    "loading_data": "loading data",
    "compiling": "compiling",
}
PHASE_TOOK = {  # phase -> how "… took 4m12s last time" names it
    "starting": "start-up",
    "loading_target": "loading the target",
    "loading_data": "loading data",
    "compiling": "compile",
    "warmup": "warm-up",
}


@dataclass(frozen=True)
class DiagnosisConfig:
    """Every threshold the rules use. Defaults suit the contract's 2 s heartbeat."""

    # liveness
    stale_factor: float = 3.0  # heartbeat older than this many intervals: hung or dead
    stall_s: float = 120.0  # training, fresh heartbeat, no step for this long: stalled loop
    buffered_s: float = 60.0  # steps advance this long with no step line: stdout buffered
    # slow phases, against earlier runs of the same config name
    slow_phase_factor: float = 2.0  # slower than this many times the usual duration …
    slow_phase_margin_s: float = 60.0  # … and by more than this (short phases jitter)
    # throughput
    baseline_tok_s: float | None = None  # no baseline, no throughput finding
    slow_pct: float = 10.0  # tok/s more than this % below the baseline
    rate_samples: int = 5  # logged steps whose median tok/s is compared
    # GIL
    gil_p99_ms: float = 20.0  # p99 wake-up lateness of the heartbeat's probe thread
    gil_beats: int = 3  # … over this many successive heartbeats (single spikes are common)
    gil_min_samples: int = 20  # a probe that woke fewer times says nothing
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
    stuck_s: float = 60.0  # no GPU: a target busy in one state this long with a full q_pre
    # memory
    role_memory_frac: float = 0.9  # a GPU holding less than this × its role's usual peak
    held_min_bytes: int = GIB  # memory left on a GPU after the run ended worth naming
    held_grace_s: float = 10.0  # the driver frees memory a few seconds after exit
    # counters that must not rise (allocator retries, recompiles)
    rise_window_s: float = 600.0


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
def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _dur(seconds: float) -> str:
    return duration(max(0.0, seconds))


def _rate(tok_s: float) -> str:
    return rate(tok_s).removesuffix(" tok/s")


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GB"


def _hb(s: Store) -> dict[str, Any]:
    return s.heartbeat or {}


def _ended(s: Store) -> bool:
    """The run is over: an exit record, a dead process, or a final phase."""
    return (
        s.exit_info() is not None
        or s.process_alive() is False
        or _hb(s).get("phase") in FINAL_PHASES
    )


def _fresh(s: Store, now: float, cfg: DiagnosisConfig) -> bool:
    age = s.heartbeat_age(now)
    return age is not None and age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S


def _live(s: Store, now: float, cfg: DiagnosisConfig, *phases: str) -> dict[str, Any] | None:
    """The heartbeat of a running run with a fresh heartbeat (in one of `phases` if given).

    Rules about a working pipeline say nothing from an old snapshot: stale_heartbeat speaks."""
    hb = s.heartbeat
    if not hb or _ended(s) or not _fresh(s, now, cfg):
        return None
    if phases and hb.get("phase") not in phases:
        return None
    return hb


def _phase_age(s: Store, now: float) -> float | None:
    started = _num(_hb(s).get("phase_started_at"))
    return None if started is None else s.remote_now(now) - started


def _threads(hb: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [t for t in hb.get("threads") or [] if t.get("role") == role]


def _in_state_s(hb: dict[str, Any], thread: dict[str, Any]) -> float:
    now, since = _num(hb.get("now")), _num(thread.get("since"))
    return 0.0 if now is None or since is None else max(0.0, now - since)


# -- history: earlier runs ------------------------------------------------------------------
def _earlier_runs(s: Store) -> list[dict[str, Any]]:
    """Earlier runs of the current run's config name, oldest first."""
    cur = s.current_run()
    if not cur or not cur.get("name"):
        return []
    created = _num(cur.get("created"))
    out = []
    for r in s.runs:
        if r.get("run_id") == cur.get("run_id") or r.get("name") != cur.get("name"):
            continue
        c = _num(r.get("created"))
        if created is not None and c is not None and c >= created:
            continue
        out.append(r)
    return sorted(out, key=lambda r: _num(r.get("created")) or 0.0)


def _phase_times(s: Store, phase: str) -> list[tuple[str, float]]:
    """(run_id, seconds) of `phase` in earlier runs of this config that got past it, oldest
    first. A run that crashed or was stopped inside the phase would make it look fast."""
    if phase not in PROGRESSION:
        return []
    later = PROGRESSION[PROGRESSION.index(phase) + 1 :]
    out = []
    for r in _earlier_runs(s):
        phases = r.get("phases") or {}
        took = _num(phases.get(phase))
        if took is not None and any(p in phases for p in later):
            out.append((str(r.get("run_id")), took))
    return out


def phase_expectation(s: Store) -> str | None:
    """What the current phase took in the last earlier run of this config, for the heartbeat
    pane: "compile took 4m12s last time". None when there is nothing to compare with."""
    phase = _hb(s).get("phase")
    if phase not in PHASE_TOOK:
        return None
    past = _phase_times(s, str(phase))
    if not past:
        return None
    return f"{PHASE_TOOK[str(phase)]} took {_dur(past[-1][1])} last time"


def _role_memory(s: Store, role: str) -> tuple[float, list[str]] | None:
    """(median peak bytes, run ids) of `role` in earlier runs of this config that trained: a
    run that stopped before training never reached its peak."""
    peaks = [
        (str(r.get("run_id")), _num((r.get("role_memory") or {}).get(role)))
        for r in _earlier_runs(s)
        if "training" in (r.get("phases") or {})
    ]
    found = [(rid, p) for rid, p in peaks if p]
    if not found:
        return None
    return statistics.median(p for _, p in found), [rid for rid, _ in found]


# -- history: heartbeats seen by diagnose() -------------------------------------------------
@dataclass
class _Beat:
    now: float
    recompiles: float | None
    gil_p99_ms: float | None
    gil_samples: float
    retries: dict[str, float]


class _Seen:
    def __init__(self) -> None:
        self.run_id: str | None = None
        self.beats: deque[_Beat] = deque(maxlen=2000)


_SEEN: weakref.WeakKeyDictionary[Store, _Seen] = weakref.WeakKeyDictionary()


def _beats(s: Store, cfg: DiagnosisConfig) -> list[_Beat]:
    """Distinct heartbeats of the current run seen so far (this one included), oldest first,
    within the longest window a rule looks back."""
    seen = _SEEN.setdefault(s, _Seen())
    hb = s.heartbeat
    if seen.run_id != s.run_id:
        seen.run_id = s.run_id
        seen.beats.clear()
    now = _num((hb or {}).get("now"))
    if hb and now is not None and (not seen.beats or now > seen.beats[-1].now):
        gil = hb.get("gil") or {}
        seen.beats.append(
            _Beat(
                now=now,
                recompiles=_num((hb.get("compile") or {}).get("recompiles")),
                gil_p99_ms=_num(gil.get("p99_ms")),
                gil_samples=_num(gil.get("samples")) or 0.0,
                retries={
                    str(dev): r
                    for dev, mem in (hb.get("memory") or {}).items()
                    if isinstance(mem, dict) and (r := _num(mem.get("alloc_retries"))) is not None
                },
            )
        )
    while seen.beats and seen.beats[-1].now - seen.beats[0].now > cfg.rise_window_s:
        seen.beats.popleft()
    return list(seen.beats)


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
def _gpu_devices(s: Store) -> dict[int, dict[str, Any]]:
    return {int(d["index"]): d for d in (s.gpu or {}).get("devices") or [] if "index" in d}


def _thread_gpu(s: Store, thread: dict[str, Any]) -> int | None:
    """The NVML index of a thread's CUDA device: by UUID when the heartbeat has it (the
    trainer's cuda:N is renumbered by CUDA_VISIBLE_DEVICES), else N (as gpu_roles() does)."""
    dev = str(thread.get("device", ""))
    devices = _gpu_devices(s)
    if not dev.startswith("cuda") or not devices:
        return None
    uuid = str(((_hb(s).get("devices") or {}).get(dev) or {}).get("uuid") or "")
    by_uuid = {str(d.get("uuid", "")).removeprefix("GPU-"): i for i, d in devices.items()}
    index = by_uuid.get(uuid.removeprefix("GPU-")) if uuid else None
    if index is None:
        try:
            index = int(dev.split(":")[1]) if ":" in dev else 0
        except ValueError:
            return None
    return index if index in devices else None


def _role_gpus(s: Store, role: str, exclusive: bool = False) -> list[int]:
    """GPUs running a `role` thread; `exclusive`: not shared with the other model's role."""
    other = {"target": "drafter", "drafter": "target"}.get(role)
    out = []
    for index, roles in sorted(s.gpu_roles().items()):
        parts = roles.split("+")
        if role in parts and not (exclusive and other in parts) and index in _gpu_devices(s):
            out.append(index)
    return out


def _util(s: Store, index: int, now: float, cfg: DiagnosisConfig) -> float | None:
    """Mean utilisation of one GPU over the window (one sample at 100% means little)."""
    since = s.remote_now(now) - cfg.util_window_s
    recent = [u for t, _, u in s.gpu_history.get(index, ()) if t >= since and u is not None]
    if recent:
        return float(statistics.fmean(recent))
    return _num(_gpu_devices(s).get(index, {}).get("util"))


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


def _queues(s: Store, hb: dict[str, Any], now: float, cfg: DiagnosisConfig) -> _Queues | None:
    """Queue depths now (heartbeat) and at the recent logged steps (metrics.jsonl)."""
    q = hb.get("queues") or {}
    pre, hs = q.get("q_pre") or [], q.get("q_hs") or []
    if not pre and not hs:
        return None
    try:
        cur = ([int(x["depth"]) for x in pre], [int(x["depth"]) for x in hs])
        caps = ([int(x["capacity"]) for x in pre], [int(x["capacity"]) for x in hs])
    except (KeyError, TypeError, ValueError):
        return None
    t_now = _num(hb.get("now")) or s.remote_now(now)
    since, t0 = s.remote_now(now) - cfg.queue_window_s, t_now
    older: list[tuple[list[int], list[int]]] = []
    for m in reversed(s.metrics):  # newest first: stop at the window's edge
        t = _num(m.get("time"))
        if t is None or t < since:
            break
        mp, mh = m.get("q_pre"), m.get("q_hs")
        if (
            isinstance(mp, list)
            and isinstance(mh, list)
            and (len(mp), len(mh)) == tuple(map(len, cur))
        ):
            older.append(([int(x) for x in mp], [int(x) for x in mh]))
            t0 = min(t0, t)
    return _Queues(caps[0], caps[1], [*reversed(older), cur], max(0.0, t_now - t0))


def _empty(cfg: DiagnosisConfig) -> Callable[[int, int], bool]:
    return lambda depth, cap: depth <= cap * cfg.queue_empty_frac


def _idle(
    s: Store, hb: dict[str, Any], role: str, waiting: str, now: float, cfg: DiagnosisConfig
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
    threads = _threads(hb, role)
    blocked = all(
        str(t.get("state", "")).startswith("waiting") and _in_state_s(hb, t) >= cfg.starved_s
        for t in threads
    )
    if not threads or not blocked or all(t.get("state") != waiting for t in threads):
        return None
    by_state: dict[str, list[str]] = {}
    for t in threads:
        by_state.setdefault(str(t.get("state")), []).append(str(t.get("name")))
    waited = min(_in_state_s(hb, t) for t in threads)
    return (
        ", ".join(f"{', '.join(names)} {state}" for state, names in by_state.items())
        + f" for {_dur(waited)}+"
    )


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
    hb = s.heartbeat or {}
    exit_info = s.exit_info() or {}
    if hb.get("phase") != "crashed" and not (
        exit_info and (exit_info.get("exit_code") not in (0, None) or exit_info.get("signal"))
    ):
        return []
    err = hb.get("error") or {}
    message = err.get("message") or exit_info.get("error") or ""
    where = f" in {err['thread']}" if err.get("thread") else ""
    how = (
        f"killed by {exit_info['signal']}"
        if exit_info.get("signal")
        else f"exit code {exit_info.get('exit_code', hb.get('exit_code'))}"
    )
    last_tb = (err.get("traceback") or "").strip().splitlines()[-1:] or [""]
    return [
        Finding(
            "critical",
            "crashed",
            f"run crashed{where} ({how})",
            message or last_tb[0] or _no_error_evidence(s, exit_info),
            "read the traceback (heartbeat error / train.log), fix, then restart (r)",
        )
    ]


def _no_error_evidence(s: Store, exit_info: dict[str, Any]) -> str:
    """What is known of a crash that recorded no error: where it was, and (unless a signal
    says it all) the logs' last words that are not step lines."""
    hb = _hb(s)
    phase = exit_info.get("final_phase") or hb.get("phase")
    step = exit_info.get("step", hb.get("step"))
    facts = ["no error recorded"]
    if phase or step is not None:
        facts.append(
            f"last heartbeat: phase {phase or '?'}, step {step if step is not None else '?'}"
        )
    if not exit_info.get("signal"):
        said = [
            ln
            for ln in list(s.log_lines)[-5:] + list(s.launch_log)[-2:]
            if ln.strip() and " step=" not in ln
        ]
        facts.extend(said[-2:])
    return "; ".join(facts)


@rule
def died_before_log(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The run exited (not cleanly) before any step line: show the launcher's and the log's
    last lines at once instead of leaving the operator to `ls` the run dir."""
    exit_info = s.exit_info()
    if not exit_info or s.step_lines:
        return []
    if exit_info.get("exit_code") == 0 and not exit_info.get("error"):
        return []
    tail = [ln for ln in list(s.launch_log)[-3:] + list(s.log_lines)[-3:] if ln.strip()]
    return [
        Finding(
            "critical",
            "died_at_start",
            "the run exited before its first step",
            " | ".join(tail[-4:]) or str(exit_info),
            "see launch.log and train.log in the run dir; fix and relaunch",
        )
    ]


@rule
def stale_heartbeat(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat thread writes every <= 2 s whatever the loop does: an old heartbeat means
    the whole process is hung (GIL held, D state) or dead."""
    hb = s.heartbeat
    if not hb or hb.get("phase") in FINAL_PHASES:
        return []
    age = s.heartbeat_age(now)
    if age is None or age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []
    alive = s.process_alive()
    what = "process dead" if alive is False else "process hung or dead"
    return [
        Finding(
            "critical",
            "stale_heartbeat",
            what,
            f"heartbeat is {_dur(age)} old (pid {hb.get('pid')}, phase "
            f"{hb.get('phase')}); it is rewritten every <= 2 s by its own thread",
            "dump stacks (d); if nothing answers, kill (k) and restart (r)",
        )
    ]


@rule
def stalled_loop(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Fresh heartbeat, old last_step_at: the process lives but the training loop is stuck;
    name the pipeline thread that has been in one state the longest."""
    hb = s.heartbeat
    if not hb or hb.get("phase") != "training" or not hb.get("last_step_at"):
        return []
    if (s.heartbeat_age(now) or 0) > cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []  # the process itself is stale: stale_heartbeat says it
    since_step = float(hb["now"]) - float(hb["last_step_at"])
    if since_step < cfg.stall_s:
        return []
    threads = [
        t for t in hb.get("threads") or [] if t.get("role") in ("drafter", "target", "prefetch")
    ]
    stuck = max(threads, key=lambda t: _in_state_s(hb, t), default=None)
    where = (
        f"{stuck['name']} ({stuck.get('state')} for {_dur(_in_state_s(hb, stuck))})"
        if stuck
        else "an unknown thread"
    )
    return [
        Finding(
            "critical",
            "loop_stalled",
            f"training loop stalled in {where}",
            f"heartbeat fresh, but no step for {_dur(since_step)} (step {hb.get('step')})",
            "dump stacks (d) to see where it waits",
        )
    ]


@rule
def output_buffered(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat's step advances but train.log gets no step line: stdout is buffered (or
    goes elsewhere), so anyone reading the log thinks the run is not training."""
    hb = s.heartbeat
    if not hb or hb.get("phase") != "training" or not s.follow_received:
        return []
    step = int(hb.get("step") or 0)
    last_line_step = s.step_lines[-1]["step"] if s.step_lines else 0
    if step - last_line_step < 2:
        return []
    reference = s.last_step_line_at
    if reference is None:
        started = [h for h in hb.get("phase_history") or [] if h.get("phase") == "training"]
        reference = float(started[-1]["started_at"]) if started else None
    if reference is None or s.remote_now(now) - reference < cfg.buffered_s:
        return []
    return [
        Finding(
            "warning",
            "output_buffered",
            "output buffered: steps advance, no step line",
            f"heartbeat at step {step}, train.log's last step line is "
            f"{'step ' + str(last_line_step) if s.step_lines else 'none'}",
            "run python with -u or PYTHONUNBUFFERED=1, or print(..., flush=True)",
        )
    ]


# -- rules: the pipeline --------------------------------------------------------------------
@rule
def stuck_target(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A target with a full q_pre that does not work: its GPU idle (or, without GPUs, its
    thread in one busy state for minutes). It has input and room for output (unless it waits
    on a full q_hs: then the drafters are slow, not it), so its thread is stuck."""
    hb = _live(s, now, cfg, "training")
    q = _queues(s, hb, now, cfg) if hb else None
    if not hb or not q:
        return []
    threads = _threads(hb, "target")
    by_name = {str(t.get("name")): t for t in threads}
    stuck: list[tuple[int, str]] = []
    for i in range(len(q.pre_cap)):
        if not q.every(0, lambda d, c: d >= c * cfg.queue_full_frac, i):
            continue
        # q_pre[i] feeds thread target-i (trainer/pipeline.py); else the i-th target thread.
        th = by_name.get(f"target-{i}") or (threads[i] if i < len(threads) else None)
        state = str((th or {}).get("state", ""))
        if state == WAIT_HS_FULL:
            continue
        name = str((th or {}).get("name", f"target {i}"))
        doing = f"'{state}' for {_dur(_in_state_s(hb, th))}" if th else "no thread info"
        gpu = _thread_gpu(s, th) if th else None
        if gpu is not None:
            util = _util(s, gpu, now, cfg)
            if util is None or util > cfg.idle_util_pct:
                continue
            stuck.append((i, f"{name} on GPU {gpu} at {util:.0f}%, {doing}"))
        elif th and not state.startswith("waiting") and _in_state_s(hb, th) >= cfg.stuck_s:
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
    """Which stage starves the others, from the queues between them, said only when the
    starved side really sits idle (GPU utilisation, or threads blocked for long without GPUs):
    some stage always limits a pipeline, and only idle hardware makes that worth a warning.
    q_pre empty -> data prefetch; q_hs empty with idle drafters -> the targets; q_hs and q_pre
    backed up with idle targets -> the drafters."""
    hb = _live(s, now, cfg, "training")
    q = _queues(s, hb, now, cfg) if hb else None
    verdict = _bottleneck(s, hb, q, now, cfg) if hb and q else None
    if verdict is None:
        return []
    code, title, evidence, action = verdict
    return [Finding("warning", code, title, evidence, action)]


def _bottleneck(
    s: Store, hb: dict[str, Any], q: _Queues, now: float, cfg: DiagnosisConfig
) -> tuple[str, str, str, str] | None:
    """(code, title, evidence, action) of the stage that starves an idle one, or None."""
    pre_empty, hs_empty = q.every(0, _empty(cfg)), q.every(1, _empty(cfg))
    if pre_empty:
        # No input for the targets: whoever idles downstream, prefetch is the cause.
        targets = _idle(s, hb, "target", WAIT_PRE_EMPTY, now, cfg)
        drafters = _idle(s, hb, "drafter", WAIT_HS_EMPTY, now, cfg) if hs_empty else None
        if not (targets or drafters):
            return None
        prefetch = "".join(
            f"; {t.get('name')} '{t.get('state')}' {_num(t.get('cpu_pct')) or 0:.0f}% CPU"
            for t in _threads(hb, "prefetch")
        )
        idle = "; ".join(x for x in (targets, drafters) if x)
        return (
            "prefetch_bottleneck",
            "data prefetch is the bottleneck",
            f"{q.text(0)} ({q.span()}); {idle}{prefetch}",
            "add prefetch threads or make batch building cheaper (tokenise ahead)",
        )
    if hs_empty:
        drafters = _idle(s, hb, "drafter", WAIT_HS_EMPTY, now, cfg)
        if not drafters:
            return None
        return (
            "targets_bottleneck",
            "targets are the bottleneck",
            f"{drafters}; {q.text(1)} ({q.span()}); {q.text(0)}",
            "give the targets more GPUs or the drafters fewer; check the target threads",
        )

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
    return (
        "drafters_bottleneck",
        "drafters are the bottleneck",
        f"{targets}; {q.text(1)} ({q.span()})",
        "add drafter replicas or give the drafters less work per batch",
    )


@rule
def role_memory_short(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """GPUs of a role (drafter, target) holding much less memory than that role peaked at in
    earlier runs of the same config: once training, a replica that does its work holds about
    the same as last time; far less means it never got batches or runs another config."""
    if not _live(s, now, cfg, "training", "checkpointing"):
        return []
    devices = _gpu_devices(s)
    found = []
    for role in ("drafter", "target"):
        usual = _role_memory(s, role)
        if usual is None:
            continue
        peak, runs = usual
        short = [
            (i, float(devices[i].get("mem_used") or 0))
            for i in _role_gpus(s, role, exclusive=True)
            if float(devices[i].get("mem_used") or 0) < cfg.role_memory_frac * peak
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
                + f" (last: {runs[-1]})",
                f"check the {role}s get batches (queues) and that this run's batch and seq "
                f"buckets match run {runs[-1]}",
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
    dead = s.exit_info() is not None or s.process_alive() is False
    devices = _gpu_devices(s)
    if not dead or not devices or s.alive_run not in (None, s.run_id):
        return []  # (with another run alive, the memory is that run's)
    exit_info = s.exit_info() or {}
    ended = _num(exit_info.get("ended_at")) or _num(_hb(s).get("now"))
    sampled = _num((s.gpu or {}).get("t"))
    if ended is not None and sampled is not None and sampled < ended + cfg.held_grace_s:
        return []  # the driver frees memory a few seconds after the exit
    used = set(s.gpu_roles()) & set(devices) or set(devices)  # the run's GPUs when known
    trainer = _num(_hb(s).get("pid")) or _num((s.liveness or {}).get("pid"))
    held: dict[int, list[str]] = {}  # pid (0: none visible) -> "79.0 GB on GPU 5"
    remote_pids: set[int] = set()
    for i in sorted(used):
        d = devices[i]
        procs = [
            p
            for p in d.get("processes") or []
            if (_num(p.get("mem_used")) or 0) >= cfg.held_min_bytes
        ]
        for p in procs:
            pid = int(p["pid"])
            held.setdefault(pid, []).append(f"{_gb(float(p['mem_used']))} on GPU {i}")
            if p.get("local") is False:
                remote_pids.add(pid)
        if not procs and float(d.get("mem_used") or 0) >= cfg.held_min_bytes:
            # Inside a container NVML may list no process, or with no memory figure.
            pids = [int(p["pid"]) for p in d.get("processes") or [] if "pid" in p]
            for pid in pids or [0]:
                held.setdefault(pid, []).append(f"{_gb(float(d['mem_used']))} on GPU {i}")
    if not held:
        return []
    parts = []
    for pid, where in held.items():
        who = "no visible process" if pid == 0 else f"pid {pid}"
        if trainer is not None and pid == int(trainer):
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
    """Loading or compiling much longer than in earlier runs of the same config: a cleared or
    invalidated compile cache, a slow disk or network mount, or a thread stuck in the phase.
    Compared with the median of earlier runs, so one odd run does not set the bar."""
    hb = _live(s, now, cfg, *SLOW_PHASES)
    elapsed = _phase_age(s, now)
    if not hb or elapsed is None:
        return []
    phase = str(hb["phase"])
    past = _phase_times(s, phase)
    if not past:
        return []
    usual = statistics.median(t for _, t in past)
    if elapsed <= cfg.slow_phase_factor * usual or elapsed - usual <= cfg.slow_phase_margin_s:
        return []
    last_run, last = past[-1]
    evidence = f"{_dur(elapsed)} so far; {_dur(last)} last time (run {last_run})"
    if len(past) > 1:
        evidence += f", median {_dur(usual)} over {len(past)} runs"
    progress = hb.get("phase_progress") or {}
    if progress.get("total"):
        evidence += f"; {progress.get('done')}/{progress['total']} {progress.get('unit', '')}"
    cache = (hb.get("compile") or {}).get("cache_dir")
    action = (
        f"check the compile cache ({cache or 'cache_dir'}) was kept: code or shape changes "
        "recompile everything; dump stacks (d) if it looks stuck"
        if phase == "compiling"
        else "check the disk or network the files come from; dump stacks (d) to see where it is"
    )
    return [
        Finding(
            "warning", "slow_phase", f"{SLOW_PHASES[phase]} slower than usual", evidence, action
        )
    ]


@rule
def code_mismatch(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The running trainer's code hash differs from what was deployed last: a fix deployed
    after the launch is not running yet (or the run imports another checkout)."""
    hb = s.heartbeat
    deployed = (s.hello or {}).get("deployed") or {}
    running, want = (hb or {}).get("code_sha256"), deployed.get("sha256")
    if not hb or _ended(s) or not running or not want or running == want:
        return []
    evidence = f"running {str(running)[:12]}, deployed {str(want)[:12]}"
    started, at = _num(hb.get("started_at")), _num(deployed.get("at"))
    if started is not None and at is not None and at > started:
        evidence += f" ({_dur(at - started)} after this run started)"
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
    all threads for seconds to minutes. Says how much the count rose lately."""
    hb = _live(s, now, cfg, "training")
    comp = (hb or {}).get("compile") or {}
    n = _num(comp.get("recompiles"))
    if not hb or not n or n <= 0:
        return []
    t_now = _num(hb.get("now")) or 0.0
    points = [(b.now, b.recompiles) for b in _beats(s, cfg) if b.recompiles is not None]
    rise, over = _rise(points, n, t_now, cfg.rise_window_s)
    evidence = f"{n:.0f} graphs compiled after warm-up ({_num(comp.get('graphs')) or 0:.0f} in all)"
    if rise > 0:
        evidence += f", +{rise:.0f} in the last {_dur(over)}"
    why = comp.get("last_recompile")
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
            f"{n:.0f} recompile{'s' if n != 1 else ''} during training",
            evidence,
            action,
        )
    ]


@rule
def allocator_retries(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The CUDA caching allocator had to free its cache and retry (num_alloc_retries): memory
    fragmentation, each retry a synchronising stall. Only a rising count matters; a few during
    warm-up are harmless. History: metrics.jsonl's per-step memory, and heartbeats seen."""
    hb = _live(s, now, cfg)
    if not hb:
        return []
    t_now = _num(hb.get("now")) or 0.0
    beats = _beats(s, cfg)
    rising = []
    for dev, mem in (hb.get("memory") or {}).items():
        cur = _num((mem or {}).get("alloc_retries"))
        if not cur or cur <= 0:
            continue
        points = [(b.now, b.retries[dev]) for b in beats if dev in b.retries]
        for m in reversed(s.metrics):  # newest first, up to the window's edge
            t = _num(m.get("time"))
            if t is None or t_now - t > cfg.rise_window_s:
                break
            v = _num(((m.get("memory") or {}).get(dev) or {}).get("alloc_retries"))
            if v is not None:
                points.append((t, v))
        rise, over = _rise(points, cur, t_now, cfg.rise_window_s)
        if rise > 0:
            rising.append((str(dev), cur, rise, over, mem))
    if not rising:
        return []
    return [
        Finding(
            "warning",
            "alloc_retries",
            f"memory fragmentation: allocator retries on {', '.join(r[0] for r in rising)}",
            "; ".join(
                f"{dev}: {cur:.0f} retries, +{rise:.0f} in the last {_dur(over)} (reserved "
                f"{_gb(_num(mem.get('reserved')) or 0)}, allocated "
                f"{_gb(_num(mem.get('allocated')) or 0)})"
                for dev, cur, rise, over, mem in rising
            ),
            "restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or lower the "
            "batch or the largest seq bucket",
        )
    ]


@rule
def gil_pressure(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A thread that sleeps 5 ms wakes late when other threads hold the GIL (or the CPU is
    oversubscribed): the pipeline threads then wait on Python, not on the GPUs. Sustained over
    several heartbeats only, as single spikes are common."""
    hb = _live(s, now, cfg, "training")
    if not hb:
        return []
    beats = _beats(s, cfg)[-cfg.gil_beats :]
    if len(beats) < cfg.gil_beats or not all(
        b.gil_p99_ms is not None
        and b.gil_p99_ms > cfg.gil_p99_ms
        and b.gil_samples >= cfg.gil_min_samples
        for b in beats
    ):
        return []
    gil = hb.get("gil") or {}
    p99 = _num(gil.get("p99_ms")) or 0.0
    busiest = sorted(
        hb.get("threads") or [], key=lambda t: _num(t.get("cpu_pct")) or 0.0, reverse=True
    )[:3]
    return [
        Finding(
            "warning",
            "gil_pressure",
            f"GIL pressure: wake-ups {p99:.0f} ms late",
            f"p99 {p99:.0f} ms (p50 {_num(gil.get('p50_ms')) or 0:.1f} ms) in the last "
            f"{len(beats)} heartbeats, over {cfg.gil_p99_ms:.0f} ms; busiest: "
            + ", ".join(f"{t.get('name')} {_num(t.get('cpu_pct')) or 0:.0f}%" for t in busiest),
            "move Python work off the pipeline threads (tokenising, collate) or run fewer "
            "threads in the process",
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
    if hb is not None and not _live(s, now, cfg, "training"):
        return []
    if hb is None and _ended(s):
        return []
    n = cfg.rate_samples
    rates = [v for m in list(s.metrics)[-n:] if (v := _num(m.get("tok_s"))) is not None]
    source = "logged steps"
    if not rates:
        rates = [float(x["tok_s"]) for x in list(s.step_lines)[-n:]]
        source = "step lines"
    if not rates and hb and (v := _num(hb.get("tok_s"))):
        rates, source = [v], "heartbeat"
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


def wandb_info(s: Store) -> dict[str, Any] | None:
    """{id, url, mode} of the run's wandb run: from the heartbeat, else from the `wandb:` lines
    wandb printed into train.log ("View run at https://wandb.ai/…/runs/<id>")."""
    hb_w = _hb(s).get("wandb")
    hb_w = hb_w if isinstance(hb_w, dict) else {}
    if hb_w.get("id") or hb_w.get("url"):
        return {"id": hb_w.get("id"), "url": hb_w.get("url"), "mode": hb_w.get("mode")}
    found: dict[str, Any] = {"id": None, "url": None, "mode": None}
    for ln in _wandb_lines(s):
        if m := _WANDB_RUN_URL.search(ln):
            found.update(url=m.group(1), id=m.group(2), mode="online")
        elif (m := _WANDB_RUN_DIR.search(ln)) and not found["id"]:
            found["id"] = m.group(1)
        if _WANDB_OFFLINE.search(ln):
            found["mode"] = "offline"
    if found["id"] or found["url"]:
        found["mode"] = found["mode"] or hb_w.get("mode")
        return found
    if hb_w.get("mode"):
        return {"id": None, "url": None, "mode": hb_w.get("mode")}
    return None


@rule
def no_step_line_yet(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """train.log shows wandb's start-up lines and no step line: readers guess between "still
    loading" and "training". Say the heartbeat's phase, how long it has been in it, and
    whether steps advance; name the wandb run."""
    hb = s.heartbeat
    wandb_lines = _wandb_lines(s)
    if not hb or not s.follow_received or s.step_lines or not wandb_lines or _ended(s):
        return []
    phase, age = str(hb.get("phase")), _phase_age(s, now)
    step = int(_num(hb.get("step")) or 0)
    last = _num(hb.get("last_step_at"))
    in_phase = f"{phase} for {_dur(age)}" if age is not None else phase
    expect = phase_expectation(s)
    wb = wandb_info(s) or {}
    run = f"; wandb run {wb['id']} ({wb.get('mode') or '?'})" if wb.get("id") else ""
    log = f"train.log: {len(wandb_lines)} wandb lines, no step line"
    if step > 0 and last is not None:
        ago = _dur(s.remote_now(now) - last)
        return [
            Finding(
                "info",
                "no_step_line",
                f"{in_phase}, step {step}, no step line yet",
                f"heartbeat: {in_phase}, steps advance (step {step}, last {ago} ago); {log}{run}",
                "training runs; step lines appear at the first logged step unless stdout is "
                "buffered",
            )
        ]
    return [
        Finding(
            "info",
            "no_step_line",
            f"{in_phase}, no step yet",
            f"heartbeat: {in_phase}" + (f" ({expect})" if expect else "") + f", step {step}; "
            f"{log}{run}",
            "not training yet: wandb prints at start-up; wait for the phase to end",
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
    _beats(s, config)  # every heartbeat diagnose() sees feeds the rules' short memory
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
