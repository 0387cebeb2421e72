"""The Qwen3.6-27B-shaped hybrid target's forward on a GPU: with and without the fast kernels
(flash-linear-attention), unpacked and packed, and whether the packed forward equals each
document alone.

    python3 bench/hybrid_forward.py --fla with|without [--layers 8] [--seq 4096]

A harness, not the operator's path: `--layers` layers of the 27B shape (3 Gated DeltaNet :
1 full attention, as the real one) with random bf16 weights built on the GPU (no disk), run
through the trainer's own `TargetFeatures`. `--fla without` hides the package before
transformers is imported, which is what a host without it gets: HF's torch reference for the
delta rule. Prints one `HYBRID ...` line.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fla", choices=["with", "without"], required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
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
    print(
        f"HYBRID fla={args.fla} (fast path: {fla_available()}) layers={n} seq={S}"
        f" docs={len(lengths)} unpacked_ms={unpacked_ms:.1f} packed_ms={packed_ms:.1f}"
        f" per_layer_unpacked_ms={unpacked_ms / n:.2f}"
        f" packed_vs_alone_max_rel_diff={worst:.2e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
