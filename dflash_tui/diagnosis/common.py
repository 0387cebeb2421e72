"""The helpers the rules share: durations and rates in words, the live heartbeat, what
the run's state allows (`possible`), the store's recent history, GPUs of a role."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from dflash_tui.diagnosis.config import (
    GIB,
    HEARTBEAT_MAX_INTERVAL_S,
    DiagnosisConfig,
)
from dflash_tui.fmt import duration, rate
from dflash_tui.state import Store
from trainer.contract.heartbeat import (
    Heartbeat,
)
from trainer.contract.phases import (
    TRAINING,
)
from trainer.contract.typed import finite


# -- small helpers ------------------------------------------------------------------------
def dur(seconds: float) -> str:
    """A duration in words (`3m12s`), never negative: a clock skew reads as 0s."""
    return duration(max(0.0, seconds))


def tok_rate(tok_s: float) -> str:
    """A tok/s figure in words without its unit (the rule's sentence says it)."""
    return rate(tok_s).removesuffix(" tok/s")


def gb(n: float) -> str:
    """Bytes as GB with one decimal."""
    return f"{n / GIB:.1f} GB"


def _fresh(s: Store, now: float, cfg: DiagnosisConfig) -> bool:
    age = s.heartbeat_age(now)
    return age is not None and age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S


def live_heartbeat(s: Store, now: float, cfg: DiagnosisConfig, *phases: str) -> Heartbeat | None:
    """The heartbeat of a running run with a fresh heartbeat (in one of `phases` if given).

    Rules about a working pipeline say nothing from an old snapshot: stale_heartbeat speaks."""
    hb = s.heartbeat
    if hb is None or s.ended() or not _fresh(s, now, cfg):
        return None
    if phases and hb.phase not in phases:
        return None
    return hb


def phase_age(s: Store, now: float) -> float | None:
    """Seconds the run has been in its phase, on the host's clock; None before a heartbeat."""
    hb = s.heartbeat
    if hb is None or not hb.phase_started_at:
        return None
    return s.remote_now(now) - hb.phase_started_at


# -- what the run's state allows ------------------------------------------------------------
@dataclass(frozen=True)
class Possible:
    """Which kinds of action the run's state allows: one answer that every rule's action obeys.

    `signal`: the run's process is there (not ended: no exit.json, not dead by the agent's
    liveness, no final phase), so dump stacks (d) and kill (K) can reach it.
    `tune`: the pipeline trains now (a fresh heartbeat in training, a step within `stall_s`,
    no graph compiling): only then is throughput advice (bottlenecks, GIL, padding, memory per
    role) about the pipeline; in a stall or a compile every thread waits on that instead."""

    signal: bool
    tune: bool


def possible(s: Store, now: float, cfg: DiagnosisConfig) -> Possible:
    hb = live_heartbeat(s, now, cfg, TRAINING)
    stepping = (
        hb is not None
        and hb.last_step_at is not None
        and hb.now - hb.last_step_at < cfg.stall_s
        and hb.compile.current is None
    )
    return Possible(signal=not s.ended(), tune=stepping)


# -- history: the store's heartbeats ---------------------------------------------------------
def recent_heartbeats(s: Store, t_now: float, window_s: float) -> list[Heartbeat]:
    """The store's heartbeats of this run within `window_s` before `t_now`, oldest first."""
    return [b for b in s.heartbeats if 0.0 <= t_now - b.now <= window_s]


def rise_in_window(
    points: Iterable[tuple[float, float]], current: float, now: float, window_s: float
) -> tuple[float, float]:
    """(how much `current` rose since the oldest point in the window, over how long)."""
    inside = sorted((t, v) for t, v in points if now - t <= window_s)
    if not inside:
        return 0.0, 0.0
    t0, v0 = inside[0]
    return current - v0, now - t0


# -- GPUs and queues ------------------------------------------------------------------------
def role_gpus(s: Store, role: str, exclusive: bool = False) -> list[int]:
    """GPUs running a `role` thread; `exclusive`: not shared with the other model's role."""
    other = {"target": "drafter", "drafter": "target"}.get(role)
    devices = s.gpu_devices()
    out = []
    for index, roles in sorted(s.gpu_roles().items()):
        parts = roles.split("+")
        if role in parts and not (exclusive and other in parts) and index in devices:
            out.append(index)
    return out


def mean_util(s: Store, index: int, now: float, cfg: DiagnosisConfig) -> float | None:
    """Mean utilisation of one GPU over the window (one sample at 100% means little)."""
    since = s.remote_now(now) - cfg.util_window_s
    recent = [p.util for p in s.gpu_history.get(index, ()) if p.t >= since and p.util is not None]
    if recent:
        return float(statistics.fmean(recent))
    device = s.gpu_devices().get(index)
    return None if device is None or device.util is None else float(device.util)


def recent_rates(s: Store, cfg: DiagnosisConfig) -> tuple[list[float], str]:
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
