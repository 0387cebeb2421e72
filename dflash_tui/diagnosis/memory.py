"""Rules of a GPU's memory over time: memory that swings (`memory_swing`)."""

from __future__ import annotations

from dflash_tui.diagnosis.common import dur, gb, possible
from dflash_tui.diagnosis.config import DEFAULT_CONFIG, DiagnosisConfig
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.memory_swing import Swing, memory_swing
from dflash_tui.state import Store


def gpu_swings(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> dict[int, Swing]:
    """Each GPU's swing over the last `swing_window_s` of samples (also the GPU pane's)."""
    out = {}
    for index, hist in s.gpu_history.items():
        pts = [(p.t, p.mem_used) for p in hist if 0.0 <= now - p.t <= cfg.swing_window_s]
        swing = memory_swing(pts, cfg.swing_min_bytes)
        if swing is not None:
            out[index] = swing
    return out


@rule(
    Code("memory_swing", ("warning",), "a GPU's memory falls by GBs and comes back"),
    reads="the GPU samples' used memory per GPU (NVML: what the processes reserved, not "
    "what they allocated) over the last `swing_window_s`",
    decides="While the pipeline trains (a fresh training heartbeat, a step within `stall_s`, "
    "nothing compiling): a GPU whose used memory fell at least `swing_min_bytes` below a peak "
    "it held earlier in the window. Allocated memory swings every step by design; reserved "
    "memory holds still in a healthy run once warm-up is over.",
    thresholds=("stale_factor", "stall_s", "swing_window_s", "swing_min_bytes"),
    action="look for torch.cuda.empty_cache() or memory-freeing calls in the loop, shapes "
    "that change every batch (fixed seq buckets), or another process on that GPU (status "
    "shows each GPU's processes); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps "
    "freed segments mapped",
)
def memory_swing_rule(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """GPUs whose memory gives GBs back and takes them again while training."""
    if not possible(s, now, cfg).tune:
        return []
    roles = s.gpu_roles()
    swinging = [
        (i, sw) for i, sw in sorted(gpu_swings(s, now, cfg).items())
        if sw.fall >= cfg.swing_min_bytes
    ]  # fmt: skip
    if not swinging:
        return []
    which = ", ".join(f"GPU {i}" for i, _ in swinging)
    return [
        Finding(
            "warning",
            "memory_swing",
            f"memory swings on {which}: reserved memory given back and taken again",
            "; ".join(
                f"GPU {i}{f' ({roles[i]})' if roles.get(i) else ''}: {gb(sw.peak)} → "
                f"{gb(sw.trough)} (−{gb(sw.fall)}), {sw.drops} fall(s) of "
                f"≥ {gb(cfg.swing_min_bytes)} in the last {dur(sw.span_s)}"
                for i, sw in swinging
            ),
            "look for torch.cuda.empty_cache() in the loop, shapes that change every batch "
            "(fixed seq buckets), or another process on that GPU; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps freed segments mapped",
        )
    ]
