"""The Qwen3.6-27B-shaped hybrid target's forward on a GPU: with and without the fast kernels
(flash-linear-attention), unpacked and packed, and whether the packed forward equals each
document alone.

    python3 bench/hybrid_forward.py --fla with|without [--layers 8] [--seq 4096]

A harness, not the operator's path: `--layers` layers of the 27B shape (3 Gated DeltaNet :
1 full attention, as the real one) with random bf16 weights built on the GPU (no disk), run
through the trainer's own `TargetFeatures`. `--fla without` hides the package before
transformers is imported, which is what a host without it gets: HF's torch reference for the
delta rule. Prints one `HYBRID ...` line.

`--profile` adds where the packed forward's GPU time goes (torch.profiler over `--reps`
forwards): kernels grouped as GEMM, Gated DeltaNet (fla's Triton kernels), the short causal
convolution, full attention, and the rest, each with its share, the ten longest kernels by
name, and the GEMMs' FLOP bound (2 x linear weights x tokens at `--peak` TFLOP/s) so the time
above it is named. Prints `HYBRID_PROFILE ...` lines. `--compile` then compiles as
`target.compile` does (`TargetFeatures.compile_layers`) and times the packed forward again
(`HYBRID_COMPILED ...`; with `--profile`, profiled again).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fla", choices=["with", "without"], required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="where the packed forward's time goes")
    p.add_argument(
        "--compile", action="store_true", help="then the same with target.compile's layers"
    )
    p.add_argument("--peak", type=float, default=769.0, help="the card's bf16 matmul TFLOP/s")
    args = p.parse_args()
    if args.fla == "without":
        sys.modules["fla"] = None  # type: ignore[assignment]  # import fla -> ImportError

    import torch
    from make_bench_target_qwen36 import TEXT, hybrid_layer_types
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from trainer.targets.load import TargetFeatures
    from trainer.targets.packing import fla_available

    dev = torch.device("cuda")
    torch.manual_seed(0)
    n = args.layers
    cfg = Qwen3_5TextConfig(**TEXT, num_hidden_layers=n, layer_types=hybrid_layer_types(n))
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU: no fp32 copy
    with torch.device(dev):
        model = Qwen3_5ForCausalLM(cfg).eval().requires_grad_(False)
    torch.set_default_dtype(torch.float32)
    reads = [n // 2 - 1, n - 1]
    feats = TargetFeatures(model.model, reads, n)
    S = args.seq
    ids = torch.randint(0, 200_000, (1, S), device=dev)
    # Chat-like document lengths (lognormal, median ~400 tokens) filling the row.
    rng = random.Random(1)
    lengths: list[int] = []
    while sum(lengths) < S:
        lengths.append(max(8, min(S - sum(lengths), int(rng.lognormvariate(6.0, 0.9)))))
    pos = torch.cat([torch.arange(k) for k in lengths])[None].to(dev)

    def timed(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000

    with torch.no_grad():
        unpacked_ms = timed(lambda: feats(ids))
        packed_ms = timed(lambda: feats(ids, pos))
        packed = feats(ids, pos)
        worst = 0.0
        at = 0
        for k in lengths:
            alone = feats(ids[:, at : at + k])
            diff = (packed[:, at : at + k] - alone).abs().max().item()
            worst = max(worst, diff / max(alone.abs().max().item(), 1e-6))
            at += k
    if args.profile:
        profile(model, lambda: feats(ids, pos), args.reps, S, args.peak)
    if args.compile:  # target.compile: full-attention layers whole, the hybrids' parts
        t = time.perf_counter()
        feats.compile_layers()
        with torch.no_grad():
            feats(ids, pos)
            compile_s = time.perf_counter() - t
            compiled_ms = timed(lambda: feats(ids, pos))
            got = feats(ids, pos).float()
        err = float((got - packed.float()).norm() / packed.float().norm())
        print(
            f"HYBRID_COMPILED packed_ms={compiled_ms:.1f} eager_packed_ms={packed_ms:.1f}"
            f" ratio={packed_ms / compiled_ms:.3f} compile_s={compile_s:.1f}"
            f" rel_diff_vs_eager={err:.2e}"
        )
        if args.profile:
            profile(model, lambda: feats(ids, pos), args.reps, S, args.peak)
    print(
        f"HYBRID fla={args.fla} (fast path: {fla_available()}) layers={n} seq={S}"
        f" docs={len(lengths)} unpacked_ms={unpacked_ms:.1f} packed_ms={packed_ms:.1f}"
        f" per_layer_unpacked_ms={unpacked_ms / n:.2f}"
        f" packed_vs_alone_max_rel_diff={worst:.2e}"
    )
    return 0


KIND_OF = (  # first match wins; names as CUDA/Triton report them on an H200
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("conv1d", ("conv", "causal_conv")),
    # inductor's own kernels (`triton_poi_fused_…`, `triton_red_fused_…`) before fla's
    # names: "fused_" would otherwise count the compiled norms and MLP as Gated DeltaNet
    ("compiled elementwise", ("triton_poi", "triton_red", "triton_per")),
    ("gated_deltanet", ("chunk", "recurrent", "delta", "l2norm", "fused_", "solve_tril", "kkt")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KIND_OF:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile(model: Any, forward: Callable[[], object], reps: int, tokens: int, peak: float) -> None:
    """Kernel time of `reps` packed forwards, by kind and by name, against the GEMM bound."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.no_grad():
        forward()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                forward()
            torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if us and ev.device_type == torch.autograd.DeviceType.CUDA:
            by_name[ev.key] = by_name.get(ev.key, 0.0) + us / 1000 / reps
    by_kind: dict[str, float] = {}
    for name, ms in by_name.items():
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + ms
    total = sum(by_kind.values())
    linear = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight.shape[0] < 200_000  # not lm_head
    )
    bound_ms = 2 * linear * tokens / (peak * 1e12) * 1000
    gemm = by_kind.get("gemm", 0.0)
    kinds = " ".join(f"{k}={v:.1f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    print(f"HYBRID_PROFILE per_forward_ms={total:.1f} {kinds}")
    print(
        f"HYBRID_PROFILE gemm_bound_ms={bound_ms:.1f} (linear weights {linear / 1e9:.2f}B x"
        f" {tokens} tokens at {peak:.0f} TFLOP/s) gemm_above_bound_ms="
        f"{gemm - bound_ms:.1f} not_gemm_ms={total - gemm:.1f}"
    )
    for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]:
        print(f"HYBRID_PROFILE kernel {ms:7.2f} ms  {kernel_kind(name):14s} {name[:110]}")


if __name__ == "__main__":
    sys.exit(main())
