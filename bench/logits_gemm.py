"""The held-out eval's logits GEMMs alone: a few rows against the 8B target's whole vocabulary.

    python3 bench/logits_gemm.py [--out r.json]     # a GPU
    .venv/bin/python bench/logits_gemm.py --small   # CPU smoke test: tiny shapes

Why: the graphed eval's profile on an H100 (bench/results-eval/h100-1207-*) spent 444 ms of its
1,548 ms of kernels in two GEMMs that read the [151936, 4096] vocabulary matrix for 120-128
rows: the target's lm_head (3.5 ms a call) and the drafter's `hidden[:, 1:] @ W.t()` (1.7 ms).
Reading 1.24 GB takes ~0.4 ms at HBM speed, so each should be ~0.4 ms. This times the ways of
writing the same product, eager and replayed in a CUDA graph (the eval replays its step), and
checks they agree. Each figure is the median of CUDA-event timed calls after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_bench import timed  # noqa: E402  (bench/: median seconds, CUDA events on a GPU)

ROWS: list[tuple[str, str, str, str]] = []


def kernel_of(fn: Callable[[], torch.Tensor]) -> str:
    """The longest GPU kernel of one call, by name (which GEMM cuBLAS picked)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    if not events:
        return "-"
    top = max(events, key=lambda e: e.device_time_total)
    return top.key[:90]


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """fn captured once as a CUDA graph; the callable replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def variants(h: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Ways of computing h @ w.t() for h [B, T, H] (possibly a strided view), w [V, H]."""
    B, T, H = h.shape
    return {
        "h @ w.t()  (3-D, as written)": lambda: h @ w.t(),
        "F.linear(h, w)  (3-D)": lambda: F.linear(h, w),
        "F.linear(h.reshape(-1, H), w)": lambda: F.linear(h.reshape(B * T, H), w),
        "F.linear(h.contiguous().view(-1, H), w)": lambda: F.linear(
            h.contiguous().view(B * T, H), w
        ),
        "(w @ h.T).T  (operands swapped)": lambda: (w @ h.reshape(B * T, H).t()).mT,
        "mm into a 128-row pad": lambda: F.linear(
            F.pad(h.reshape(B * T, H), (0, 0, 0, (-(B * T)) % 128)), w
        )[: B * T],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device("cpu" if args.small or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    V, H = (512, 64) if args.small else (151936, 4096)
    torch.manual_seed(0)
    w = torch.randn(V, H, device=device, dtype=dtype) * 0.02
    bytes_w = w.numel() * w.element_size()
    if device.type == "cuda":
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    # The eval's shapes: 8 rows x 16 (the target's verify block), the drafter's 8 x (16 - 1)
    # taken as a strided slice of its [8, 16, H] hidden, and one prompt's 16 alone.
    cases = {
        "target verify [8, 16]": torch.randn(8, 16, H, device=device, dtype=dtype),
        "drafter [8, 16][:, 1:]": torch.randn(8, 16, H, device=device, dtype=dtype)[:, 1:],
        "one prompt [1, 16]": torch.randn(1, 16, H, device=device, dtype=dtype),
    }
    for backend in ["default", "cublaslt", "cublas"] if device.type == "cuda" else ["default"]:
        if backend != "default":
            torch.backends.cuda.preferred_blas_library(backend)
        for case, h in cases.items():
            reference = (h.float() @ w.float().t()).to(dtype)
            for name, fn in variants(h, w).items():
                out = fn()
                err = (out.float() - reference.reshape(out.shape).float()).abs().max().item()
                eager = timed(fn, args.calls, 3, device) * 1e3
                graph = (
                    timed(graphed(fn), args.calls, 3, device) * 1e3
                    if device.type == "cuda"
                    else None
                )
                kernel = kernel_of(fn) if device.type == "cuda" and backend == "default" else ""
                if kernel:
                    print(f"  kernel: {kernel}", flush=True)
                hbm = bytes_w / (min(eager, graph or eager) * 1e-3) / 1e12
                ROWS.append((
                    f"{backend} | {case} | {name}", f"{eager:.3f}",
                    "-" if graph is None else f"{graph:.3f}", f"{hbm:.2f} TB/s (err {err:.3g})",
                ))  # fmt: skip
                print(" | ".join(ROWS[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps([list(r) for r in ROWS], indent=1))
    print("\n| backend, case, way | eager ms | graphed ms | W read at |\n|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
