"""Where the drafter's training step goes, alone on one GPU, and what makes it shorter.

    python3 bench/drafter_step.py [--only profile attention step] [--out r.json]
    python3 bench/drafter_step.py --small        # a CPU smoke test of the same code

Sections (the Qwen3-8B shapes of bench/gpu_bench.py: a 5-layer drafter, 512 anchors of 16,
one 4096-token row; the step is the drafter thread's: forward, the fused chunk loss,
backward, the clip folded into fused AdamW, zero_grad):
  profile    kernel time per step by class (GEMM, lm_head GEMM, attention, optimizer,
             other) and the 25 longest kernels, from torch.profiler over 3 steps
  attention  the drafter's flex attention alone, forward + backward on the step's own
             block mask: torch's default kernel options against candidates
             (`trainer.model.attention.FLEX_KERNEL_OPTIONS`), and a max-autotune compile
             whose table Inductor prints (what the candidates are drawn from)
  step       the whole step per variant: the trainer's (layers compiled one by one), the
             drafter compiled whole, and the best attention options of `attention`

Each time is the median of `--steps` CUDA-event timed steps after warm-up. Table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from gpu_bench import (  # noqa: E402
    Shapes,
    bench_settings,
    drafter_flops,
    make_drafter,
    synthetic_blocks,
    timed,
    visible_pairs,
)
from profile_report import kernel_class  # noqa: E402

from trainer.model import attention  # noqa: E402
from trainer.model.optim import clip_in_step  # noqa: E402
from trainer.model.step import BlockBatch, attach_mask, drafter_loss  # noqa: E402
from trainer.runtime.pipeline import autocast_for  # noqa: E402

ROWS: list[tuple[str, str]] = []
RESULTS: dict[str, Any] = {}
VOCAB_MIN = 100_000

# Candidate flex kernel options (forward: BLOCK_M/N; backward: BLOCK_M1/N1/M2/N2, warps,
# stages; USE_TMA: Hopper's bulk copies). Each must divide the 128-token sparse tile.
CANDIDATES: dict[str, dict[str, Any]] = {
    "tma": {"USE_TMA": True},
    "fwd128x64": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 8, "fwd_num_stages": 3},
    "bwd64x128": {
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 64,
        "bwd_num_warps": 8,
        "bwd_num_stages": 3,
    },
    "bwd32x128": {
        "bwd_BLOCK_M1": 32,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 32,
        "bwd_num_warps": 4,
        "bwd_num_stages": 3,
    },
}


def row(what: str, figure: str) -> None:
    ROWS.append((what, figure))
    print(f"  {what}: {figure}", flush=True)


def inputs(sh: Shapes, device: torch.device) -> tuple[BlockBatch, torch.Tensor]:
    blocks = synthetic_blocks(sh, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    features = torch.randn(sh.B, sh.S, sh.n_draft * sh.H, generator=g, device=device, dtype=dtype)
    return blocks, features


def drafter_step(
    sh: Shapes, device: torch.device, blocks: BlockBatch, features: torch.Tensor, whole: bool
) -> Callable[[], None]:
    """The drafter thread's step (trainer/runtime/pipeline.py): autocast forward and loss,
    backward, the clip folded into fused AdamW, zero_grad."""
    settings = bench_settings(sh, device)
    attach_mask(blocks, settings.backend, sh.bs)
    cuda = device.type == "cuda"
    model = make_drafter(sh, device, compiled=cuda and not whole)
    if cuda and whole:
        attention.compiled_flex_attention()
        model.compile(dynamic=False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=6e-4, fused=cuda)

    def step() -> None:
        with autocast_for(device):
            loss = drafter_loss(model, blocks, features, settings).loss
        loss.backward()
        clip_in_step(opt, params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def graphed_drafter_step(
    sh: Shapes, device: torch.device, blocks: BlockBatch, features: torch.Tensor
) -> Callable[[], None]:
    """The same step captured whole as one CUDA graph (fixed shapes: one bucket), replayed:
    what graphs could take back of the launch gaps between the step's ~1,500 kernels. The
    optimizer is fused AdamW with `capturable=True` (its step count and lr on the device).
    Raises if the step cannot be captured (a host sync inside it, say): the caller says why."""
    settings = bench_settings(sh, device)
    attach_mask(blocks, settings.backend, sh.bs)
    model = make_drafter(sh, device, compiled=True)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = torch.tensor(6e-4, device=device)
    opt = torch.optim.AdamW(params, lr=lr, fused=True, capturable=True)

    def body() -> None:
        with autocast_for(device):
            loss = drafter_loss(model, blocks, features, settings).loss
        loss.backward()
        clip_in_step(opt, params, 1.0)
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles, allocates the state
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the grads are then allocated from the graph's pool
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def fresh_compiles() -> None:
    """Forget compiled graphs, so the next variant compiles with its own options."""
    torch._dynamo.reset()
    attention.forget_compiled_flex()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_annotation(name: str) -> bool:
    """A CPU-side range the profiler also draws on the GPU's timeline (a compiled graph's
    call, `Optimizer.step#AdamW.step`): it spans kernels already counted, not one of its own."""
    return name.startswith("## ") or name.startswith("Optimizer.")


def section_profile(sh: Shapes, device: torch.device, steps: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    blocks, features = inputs(sh, device)
    step = drafter_step(sh, device, blocks, features, whole=False)
    for _ in range(3):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    n = 3
    with profile(activities=acts, record_shapes=True) as prof:
        for _ in range(n):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    by_class: dict[str, float] = defaultdict(float)
    kernels: list[tuple[float, int, str]] = []
    for evt in prof.key_averages():
        if evt.device_type != torch.autograd.DeviceType.CUDA or is_annotation(evt.key):
            continue
        us = evt.self_device_time_total
        cls = kernel_class(evt.key, "kernel")
        by_class[cls] += us / n
        kernels.append((us / n, evt.count // n, evt.key))
    total = sum(by_class.values())
    RESULTS["profile_ms"] = {k: round(v / 1e3, 2) for k, v in by_class.items()}
    row("profiled kernel time a step", f"{total / 1e3:.1f} ms")
    for cls, us in sorted(by_class.items(), key=lambda kv: -kv[1]):
        row(f"  {cls}", f"{us / 1e3:.1f} ms ({us / max(total, 1):.0%})")
    kernels.sort(reverse=True)
    print("top kernels (ms a step, calls a step, name):")
    for us, calls, name in kernels[:25]:
        print(f"  {us / 1e3:7.2f} {calls:4d}  {name[:150]}")
    RESULTS["top_kernels"] = [(round(us / 1e3, 3), c, k[:200]) for us, c, k in kernels[:25]]


def _attention_inputs(sh: Shapes, device: torch.device, blocks: BlockBatch) -> tuple[Any, ...]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    Q, KV = sh.N * sh.bs, sh.S + sh.N * sh.bs
    g = torch.Generator(device=device).manual_seed(1)

    def t(heads: int, length: int) -> torch.Tensor:
        x = torch.randn(sh.B, heads, length, sh.D, generator=g, device=device, dtype=dtype)
        return x.requires_grad_()

    q, k, v = t(sh.heads, Q), t(sh.kv, KV), t(sh.kv, KV)
    grad = torch.randn(sh.B, sh.heads, Q, sh.D, generator=g, device=device, dtype=dtype)
    mask = attention.make_mask("flex", blocks.anchors, blocks.keep, sh.S, sh.bs)
    return q, k, v, grad, mask


def section_attention(sh: Shapes, device: torch.device, steps: int) -> str | None:
    """The fastest candidate's name (None: torch's defaults are fastest)."""
    blocks, _ = inputs(sh, device)
    q, k, v, grad, mask = _attention_inputs(sh, device, blocks)
    pairs = visible_pairs(blocks, sh) * sh.heads
    flops = 4 * sh.D * pairs * 3.5  # forward + backward (2.5x), as gpu_bench counts
    times: dict[str, float] = {}
    for name, options in [("default", None), *CANDIDATES.items()]:
        fresh_compiles()
        attention.FLEX_KERNEL_OPTIONS = options

        def fwd_bwd() -> None:
            out = attention.attend(q, k, v, mask)
            torch.autograd.grad(out, (q, k, v), grad)

        try:
            t0 = time.perf_counter()
            fwd_bwd()
            first = time.perf_counter() - t0
            times[name] = t = timed(fwd_bwd, min(steps, 10), 3, device)
        except Exception as e:  # a candidate the kernel cannot take (shared memory, say)
            row(f"attention fwd+bwd, {name}", f"failed: {type(e).__name__}: {str(e)[:120]}")
            continue
        row(
            f"attention fwd+bwd, {name} (first call {first:.1f}s)",
            f"{t * 1e3:.2f} ms, {flops / t / 1e12:.0f} TFLOP/s",
        )
    attention.FLEX_KERNEL_OPTIONS = None
    if device.type == "cuda" and not os.environ.get("BENCH_SKIP_AUTOTUNE"):
        # Inductor prints each choice's time: the candidates above come from such tables.
        fresh_compiles()
        from torch.nn.attention.flex_attention import flex_attention

        tuned = torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")

        def tuned_fwd_bwd() -> None:
            out = tuned(q, k, v, block_mask=mask, enable_gqa=True)
            torch.autograd.grad(out, (q, k, v), grad)

        t0 = time.perf_counter()
        tuned_fwd_bwd()
        first = time.perf_counter() - t0
        times["max-autotune"] = t = timed(tuned_fwd_bwd, min(steps, 10), 3, device)
        row(f"attention fwd+bwd, max-autotune (compile {first:.1f}s)", f"{t * 1e3:.2f} ms")
    RESULTS["attention_ms"] = {k: round(v * 1e3, 3) for k, v in times.items()}
    picks = {k: v for k, v in times.items() if k in CANDIDATES}
    best = min(picks, key=picks.__getitem__) if picks else None
    if best is None or picks[best] >= times.get("default", float("inf")) * 0.98:
        return None
    return best


def section_step(sh: Shapes, device: torch.device, steps: int, best: str | None) -> None:
    blocks, features = inputs(sh, device)
    flops = drafter_flops(sh, visible_pairs(blocks, sh))
    variants: list[tuple[str, bool, dict[str, Any] | None]] = [("trainer's", False, None)]
    if device.type == "cuda":
        variants.append(("drafter compiled whole", True, None))
        variants.append(("layers compiled, the step one CUDA graph", False, {"graph": True}))
        if best is not None:
            variants.append((f"layers compiled, flex options {best}", False, CANDIDATES[best]))
    times: dict[str, float] = {}
    for name, whole, options in variants:
        fresh_compiles()
        graphed = options is not None and options.get("graph", False)
        attention.FLEX_KERNEL_OPTIONS = None if graphed else options
        t0 = time.perf_counter()
        if graphed:
            try:
                step = graphed_drafter_step(sh, device, blocks, features)
            except Exception as e:  # a failed capture is a result: said, then the next
                row(f"drafter step, {name}", f"capture failed: {type(e).__name__}: {e}"[:300])
                torch.cuda.synchronize()
                continue
        else:
            step = drafter_step(sh, device, blocks, features, whole)
        step()
        first = time.perf_counter() - t0
        times[name] = t = timed(step, steps, 3, device)
        peak = RESULTS.get("peak_flops", 769e12)
        row(
            f"drafter step, {name} (first step {first:.1f}s)",
            f"{t * 1e3:.1f} ms, {sh.B * sh.S / t:,.0f} tok/s, {flops / t / peak:.1%} of peak",
        )
        del step
    attention.FLEX_KERNEL_OPTIONS = None
    base = times["trainer's"]
    for name, t in times.items():
        if name != "trainer's":
            row(f"drafter step, trainer's / {name}", f"{base / t:.3f}x")
    RESULTS["step_ms"] = {k: round(v * 1e3, 2) for k, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke test)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--only", nargs="*", default=["profile", "attention", "step"])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    sh = Shapes(args.small)
    RESULTS.update(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
    )
    print(f"device {RESULTS['device']}, torch {torch.__version__}", flush=True)
    best = None
    if "profile" in args.only:
        section_profile(sh, device, args.steps)
    if "attention" in args.only and device.type == "cuda":
        best = section_attention(sh, device, args.steps)
    if "step" in args.only:
        section_step(sh, device, args.steps, best)
    if args.out:
        args.out.write_text(json.dumps(RESULTS, indent=1, default=str) + "\n")
    print("\n| what | figure |\n|---|---|")
    for what, figure in ROWS:
        print(f"| {what.strip()} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
