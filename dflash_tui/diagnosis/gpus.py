"""Rules of the GPUs: memory short of the role's usual, allocator retries, throttled clocks,
uncorrected ECC errors."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from dflash_tui.diagnosis.common import (
    dur,
    gb,
    live_heartbeat,
    possible,
    recent_heartbeats,
    rise_in_window,
    role_gpus,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.facts import (
    expected_memory,
)
from dflash_tui.state import Store, clock_reason_names
from trainer.contract.heartbeat import (
    DeviceMemory,
)
from trainer.contract.phases import (
    TRAINING,
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
)


@rule(
    Code("memory_short", ("warning",), "a role's GPUs hold much less memory than usual"),
    reads="the GPU sample's used memory per GPU, the role's peak in earlier comparable runs "
    "(facts.expected_memory)",
    decides="While the pipeline trains (a fresh training heartbeat, a step within `stall_s`, "
    "nothing compiling): a GPU of a role (not shared with the other model) holding less "
    "than `role_memory_frac` × that role's peak in earlier comparable runs: it never got "
    "batches, or runs another config.",
    thresholds=("stale_factor", "stall_s", "role_memory_frac"),
    action="check the role's GPUs get batches (queues) and that this run's batch and seq "
    "buckets match the earlier run named",
)
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
            for i in role_gpus(s, role, exclusive=True)
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
                ", ".join(f"GPU {i} {gb(m)}" for i, m in short)
                + f"; a {role} peaked at {gb(peak)} in earlier runs of this config"
                + f" (last: {usual.last_run})",
                f"check the {role}s get batches (queues) and that this run's batch and seq "
                f"buckets match run {usual.last_run}",
            )
        )
    return found


@rule(
    Code("alloc_retries", ("warning",), "the CUDA allocator retries: memory fragmentation"),
    reads="the heartbeat's per-device memory (num_alloc_retries), the store's recent "
    "heartbeats and metrics.jsonl's memory",
    decides="A fresh heartbeat, and a device whose retry count is above 0 and rose within "
    "the last `rise_window_s`: only a rising count matters (a few in warm-up are harmless).",
    thresholds=("stale_factor", "rise_window_s"),
    action="restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or lower the batch "
    "or the largest seq bucket",
)
def allocator_retries(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The CUDA caching allocator had to free its cache and retry (num_alloc_retries): memory
    fragmentation, each retry a synchronising stall. Only a rising count matters; a few during
    warm-up are harmless. History: metrics.jsonl's per-step memory and the store's
    heartbeats."""
    hb = live_heartbeat(s, now, cfg)
    if hb is None:
        return []
    t_now = hb.now
    beats = recent_heartbeats(s, t_now, cfg.rise_window_s)
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
        rise, over = rise_in_window(points, cur, t_now, cfg.rise_window_s)
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
                f"{dev}: {cur} retries, +{rise:.0f} in the last {dur(over)} (reserved "
                f"{gb(mem.reserved)}, allocated {gb(mem.allocated)})"
                for dev, cur, rise, over, mem in rising
            ),
            "restart with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or lower the "
            "batch or the largest seq bucket",
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
        f"samples over {dur(g.span_s)}"
    )


@rule(
    Code("gpu_throttled", ("warning", "info"), "a GPU of the run held below its clocks"),
    reads="the GPU samples of the last `throttle_window_s` (NVML's clock event reasons, SM "
    "clock and its max, power limit, temperature), the GPUs' roles",
    decides="While training (a fresh heartbeat), per GPU of the run with at least "
    "`throttle_min_samples` samples carrying reasons in the last `throttle_window_s`. "
    "Warning: thermal, HW slowdown or a power brake in `throttle_share` or more of them; or "
    "the power cap, application clocks or sync boost that often with its median busy SM "
    "clock `clock_gap_frac` or more below its same-role peers'. Info: the power cap alone in "
    "`throttle_share` of the samples and no GPU below its peers (what sustained training "
    "normally runs into).",
    thresholds=(
        "stale_factor",
        "throttle_window_s",
        "throttle_min_samples",
        "throttle_share",
        "clock_gap_frac",
    ),
    action="thermal: check the GPU's cooling. HW slowdown or power brake: check its power "
    "supply and board. Capped below its peers: compare and raise its power limit "
    "(nvidia-smi -pl). Clocked below its peers: reset its clocks (nvidia-smi -rgc, -rac). "
    "Info: nothing to do.",
)
def gpu_throttled(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A GPU of the training run held below its clocks for a sustained share of the recent
    samples. Heat, the board's slowdown signal or a power brake: warning. The power cap on
    its own is what a sustained load normally runs into (an H200 training ran power-capped in
    91-100 % of samples): info, unless that GPU runs well below its peers of the same role,
    which the replicas' step (or the targets' feed) then waits for: warning; so is one held
    below its peers by clocks set or locked lower (application clocks) or sync boost."""
    if live_heartbeat(s, now, cfg, TRAINING) is None:
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
                f"power cap in {share:.0%}+ of the last {dur(cfg.throttle_window_s)}'s samples "
                f"(SM clocks: {clocks}); no GPU below its peers: normal under sustained load",
                "nothing to do; a GPU that falls below its peers' clock is said as a warning",
            )
        ]
    return []


@rule(
    Code("gpu_ecc_errors", ("critical",), "a GPU of the run counted uncorrected ECC errors"),
    reads="the GPU samples' volatile uncorrected ECC count since the run started",
    decides="On a GPU of the run, the rises of the count between successive samples since "
    "the run started add up to `ecc_rise_min` or more (only rises count: the count resets "
    "when the driver reloads). Said also after the run ended: it explains a crash.",
    thresholds=("ecc_rise_min",),
    action="stop the run and resume from the last good checkpoint without that GPU "
    "(CUDA_VISIBLE_DEVICES); nvidia-smi -q -d ECC,ROW_REMAPPER says if it needs a reset",
)
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
                f"({pts[0][1]} -> {pts[-1][1]} over {dur(pts[-1][0] - pts[0][0])} of samples, "
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


# -- a wedged GPU ---------------------------------------------------------------------------
# Xids that leave the board needing a reset or more (NVIDIA's Xid catalogue); the others
# (13, 31, 43, 45…) are an application's fault, which its own process dies of.
XID_WEDGE = {
    48: "double-bit ECC error",
    61: "micro-controller breakpoint",
    62: "micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "row remapping failure",
    74: "NVLink error",
    79: "fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def pci_key(bus_id: str) -> str:
    """`bus:device` of a PCI address, as NVML (`00000000:3B:00.0`) and an Xid line
    (`0000:3b:00`) both write it."""
    parts = bus_id.lower().split(".")[0].split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else bus_id.lower()


def _orphaned_for(s: Store, index: int, since: float, cfg: DiagnosisConfig) -> float | None:
    """How long GPU `index` has held `held_min_bytes` with no process listed, when every
    sample since `since` (and one before it) says so; else None."""
    hist = list(s.gpu_history.get(index, ()))
    older = [p for p in hist if p.t <= since]
    recent = [p for p in hist if p.t > since]
    if not older or not recent:
        return None  # not watched for the whole window yet
    window = [older[-1], *recent]
    if any(p.procs or p.error or p.mem_used < cfg.held_min_bytes for p in window):
        return None
    start = window[0].t
    for p in reversed(older[:-1]):  # back to where it began, for the evidence
        if p.procs or p.error or p.mem_used < cfg.held_min_bytes:
            break
        start = p.t
    return hist[-1].t - start


def _owner_seen_since(s: Store, since: float) -> bool:
    """A run anywhere under the run root alive, or the followed one's heartbeat, its exit
    or its process seen since `since`: its memory has an owner."""
    if s.alive_run is not None or s.process_alive():
        return True
    hb, ex = s.heartbeat, s.exit_info()
    return (hb is not None and hb.now > since) or (
        ex is not None and ex.ended_at is not None and ex.ended_at > since
    )


@rule(
    Code(
        "gpu_wedged",
        ("critical", "warning"),
        "a GPU is wedged: lost to NVML, faulted in the kernel log, or holding memory no "
        "process owns",
    ),
    reads="the GPU samples (NVML's error per GPU, its memory used and the processes it "
    "lists, the volatile uncorrected ECC count, the PCI address), the kernel log's Xid lines "
    "(the agent reads dmesg or /dev/kmsg; unreadable inside most containers, which status "
    "says once), the runs list's alive run, the followed run's heartbeat and exit",
    decides="Critical: NVML fails on a GPU in the newest sample (`GPU is lost` after Xid "
    "79, or any other NVML error while the others answer), or on every call (the newest "
    "sample is the sampler's error); or an Xid of a kind that needs a "
    "reset (XID_WEDGE: 48, 61-64, 74, 79, 92, 94, 95, 119, 120) in the last `xid_window_s` "
    "on a GPU that also shows another sign below, or on a PCI address no GPU answers for "
    "(NVML gave every GPU's). "
    "Warning: such an Xid alone, on a GPU NVML still reads; a GPU holding `held_min_bytes` "
    "or more with no process listed on it in every sample of the last `orphan_memory_s` "
    "while no run is alive and none was seen in that time (inside a container NVML lists no "
    "process even for a live run: only time with no owner anywhere counts); volatile "
    "uncorrected ECC errors on a GPU while no run is alive (a reset clears them and applies "
    "pending row remaps; during a run `gpu_ecc_errors` says it).",
    thresholds=("xid_window_s", "held_min_bytes", "orphan_memory_s"),
    action="once no process holds it: dflash-tui gpu-reset TARGET INDEX (nvidia-smi "
    "--gpu-reset on the host, then NVML's check); if the reset is refused or NVML still "
    "fails, reboot the host (Xid 79 repeating: reseat or replace the board)",
)
def gpu_wedged(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """A GPU that will not run work until it is reset: NVML lost it, the driver logged a
    fatal Xid for it, it holds memory with no owner anywhere for a long time, or it counted
    uncorrected ECC errors with no run on it. One finding for all of them, worst first."""
    gpu = s.gpu
    if gpu is not None and gpu.state == "error":  # NVML fails whole: no GPU can be read
        return [
            Finding(
                "critical",
                "gpu_wedged",
                "GPU sampling fails on this host",
                f"the agent's sampler ({gpu.backend}): {gpu.reason}",
                "nvidia-smi on the host names the GPU that fails; once no process holds "
                f"it: dflash-tui gpu-reset {s.target} INDEX; else reboot the host",
            )
        ]
    if gpu is None or gpu.state is not None:
        return []
    remote_now = s.remote_now(now)
    by_pci = {pci_key(d.pci_bus_id): d.index for d in gpu.devices if d.pci_bus_id}
    signs: dict[int | str, list[str]] = {}  # GPU index, or an Xid's PCI address no GPU has
    critical: set[int | str] = set()
    for d in gpu.devices:
        if d.error:
            signs.setdefault(d.index, []).append(f"NVML: {d.error}")
            critical.add(d.index)
    nobody = not _owner_seen_since(s, remote_now - cfg.orphan_memory_s)
    for d in gpu.devices:
        if d.error:
            continue
        held_s = _orphaned_for(s, d.index, remote_now - cfg.orphan_memory_s, cfg)
        if nobody and held_s is not None:
            signs.setdefault(d.index, []).append(
                f"{gb(d.mem_used)} held with no process listed for {dur(held_s)}, no run alive"
            )
        if d.ecc_uncorrected and s.alive_run is None and not s.process_alive():
            signs.setdefault(d.index, []).append(
                f"{d.ecc_uncorrected} uncorrected ECC errors since the driver loaded"
            )
    for x in gpu.xids:
        if x.code not in XID_WEDGE or remote_now - x.t > cfg.xid_window_s:
            continue
        where: int | str = by_pci.get(pci_key(x.pci), x.pci or "?")
        # An address no GPU answers for, where NVML gave every GPU's: that GPU is gone.
        gone = isinstance(where, str) and len(by_pci) == len(gpu.devices)
        if gone or where in signs:
            critical.add(where)
        signs.setdefault(where, []).append(
            f"kernel log: Xid {x.code} ({XID_WEDGE[x.code]}) {dur(remote_now - x.t)} ago"
        )
    if not signs:
        return []
    order = sorted(signs, key=lambda k: (k not in critical, str(k)))
    names = [f"GPU {k}" if isinstance(k, int) else f"PCI {k}" for k in order]
    evidence = "; ".join(
        f"{name}: {', '.join(dict.fromkeys(signs[k]))}"
        for name, k in zip(names, order, strict=True)
    )
    indexes = [k for k in order if isinstance(k, int)]
    reset = (
        " then ".join(f"dflash-tui gpu-reset {s.target} {i}" for i in indexes[:2])
        if indexes
        else "nvidia-smi -q on the host names the GPU at that PCI address"
    )
    return [
        Finding(
            "critical" if critical else "warning",
            "gpu_wedged",
            f"{', '.join(names)} wedged" if critical else f"{', '.join(names)} may be wedged",
            evidence,
            f"once no process holds it: {reset}; if the reset is refused or NVML still "
            "fails, reboot the host",
        )
    ]
