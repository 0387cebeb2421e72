"""The thresholds every rule reads (`DiagnosisConfig`), and a named target's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEARTBEAT_MAX_INTERVAL_S = 2.0  # the contract: replaced every <= 2 s
GIB = 1 << 30


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
    swing_window_s: float = 300.0  # a GPU's used memory over this long …
    swing_min_bytes: int = 2 * GIB  # … falling this far below a peak it held: a swing
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


def config_for(extra: dict[str, Any]) -> DiagnosisConfig:
    """The thresholds a named target sets in ~/.config/dflash-tui/config.toml."""
    baseline = extra.get("baseline_tok_s")
    if baseline is None:
        return DEFAULT_CONFIG
    return replace(DEFAULT_CONFIG, baseline_tok_s=float(baseline))
