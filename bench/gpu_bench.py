"""The trainer on one GPU, against the physical limit. One script, a table printed last.

    python3 bench/gpu_bench.py --out bench/results.json            # on the H200
    python3 bench/gpu_bench.py --small --out /tmp/r.json           # a CPU smoke test

Sections (each timed with CUDA events after warm-up, best of a few repeats):
  peak      bf16 8192^3 matmul: the ceiling MFU is measured against
  drafter   drafter fwd+bwd on synthetic target features: tok/s, analytic FLOPs, MFU
  attention fwd+bwd, compiled block-sparse flex vs dense-mask SDPA, S = 4k/8k/16k;
            and the block mask build time
  lm_head   chunked loss (fused, checkpointed) vs naive full logits: time, peak memory,
            lm_head calls
  target    truncated target forward: tok/s
  target_packed  the same on packed rows of the bundled chat data: the dense mask, torch's
            varlen kernel, flex with a document mask; then with its layers compiled
  optimizer the optimizer stage alone: clip + fused AdamW (the trainer's), the clip folded
            into fused AdamW's grad_scale, and that captured as a CUDA graph
  pipeline  the threaded pipeline, all roles on one GPU: tok/s, efficiency, recompiles,
            host syncs per steady-state step
Qwen3-8B-shaped, random weights: hidden 4096, 36 layers, 32/8 heads, vocab 151,936;
drafter 5 layers, block 16, 512 anchors; sequences of 4096 tokens.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from gpu_timeline import GpuSampler, KernelTimeline, sustained  # noqa: E402  (bench/)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from trainer.data.samples import Batch, LoadReport, Sample  # noqa: E402
from trainer.model.attention import (  # noqa: E402
    attend,
    make_block_mask,
    make_dense_mask,
    resolve_backend,
)
from trainer.model.blocks import sample_anchors  # noqa: E402
from trainer.model.drafter import DFlashDrafter, DrafterArch  # noqa: E402
from trainer.model.loss import dflash_loss  # noqa: E402
from trainer.model.step import BlockBatch, LossSettings, drafter_loss  # noqa: E402
from trainer.runtime.pipeline import autocast_for  # noqa: E402
from trainer.runtime.setup import compile_layers  # noqa: E402
from trainer.targets.load import TargetFeatures, default_target_layer_ids  # noqa: E402

RESULTS: dict[str, Any] = {}
SAMPLER: GpuSampler | None = None  # set in main(): clocks and power per section
TRACES: Path | None = None  # --trace-dir: gzipped Chrome traces of the profiled windows
ROWS: list[tuple[str, str, str]] = []


def row(what: str, figure: str, target: str = "") -> None:
    ROWS.append((what, figure, target))
    print(f"  {what}: {figure}  {target}", flush=True)


def save(out: Path) -> None:
    out.write_text(json.dumps(RESULTS, indent=1, default=str) + "\n")


def timed(fn: Any, iters: int, warmup: int, device: torch.device) -> float:
    """Median seconds per call, CUDA events on GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


class Shapes:
    def __init__(self, small: bool) -> None:
        if small:  # CPU smoke test: the same code, tiny numbers
            self.H, self.L, self.heads, self.kv, self.D, self.I, self.V = 64, 6, 4, 2, 16, 128, 512
            self.n_draft, self.bs, self.N, self.S, self.B = 2, 16, 16, 256, 1
            self.attn_S = [256, 512]
        else:
            self.H, self.L, self.heads, self.kv, self.D, self.I, self.V = (
                4096,
                36,
                32,
                8,
                128,
                12288,
                151936,
            )
            self.n_draft, self.bs, self.N, self.S, self.B = 5, 16, 512, 4096, 1
            self.attn_S = [4096, 8192, 16384]


def drafter_flops(sh: Shapes, visible_pairs: float) -> float:
    """Analytic FLOPs of one drafter training step (fwd+bwd) on B sequences."""
    Q, S, H = sh.N * sh.bs, sh.S, sh.H
    qo = 2 * Q * H * sh.heads * sh.D * 2  # q_proj + o_proj
    kv = 2 * (S + Q) * H * sh.kv * sh.D * 2  # k_proj + v_proj over [context ; block]
    mlp = 3 * 2 * Q * H * sh.I
    layer_fwd = qo + kv + mlp
    attn_fwd = 4 * sh.D * sh.heads * visible_pairs  # QK^T and PV over the visible pairs
    fc = 2 * S * sh.n_draft * H * H
    head = 2 * Q * H * sh.V
    # Trainable matmuls: fwd + 2x bwd. Attention: fwd + 2.5x bwd (5 GEMMs vs 2).
    # fc: fwd + weight grad (its input, the target's features, needs no grad).
    # lm_head is frozen: fwd + input grad.
    per_seq = sh.n_draft * (3 * layer_fwd + 3.5 * attn_fwd) + 2 * fc + 2 * head
    return per_seq * sh.B


def make_drafter(sh: Shapes, device: torch.device, compiled: bool) -> DFlashDrafter:
    arch = DrafterArch(
        hidden_size=sh.H,
        num_layers=sh.n_draft,
        num_heads=sh.heads,
        num_kv_heads=sh.kv,
        head_dim=sh.D,
        intermediate_size=sh.I,
        vocab_size=sh.V,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        block_size=sh.bs,
        mask_token_id=sh.V - 1,
        target_layer_ids=tuple(default_target_layer_ids(sh.L, sh.n_draft)),
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    embed = (torch.randn(sh.V, sh.H, device=device) * 0.02).to(dtype)
    head = (torch.randn(sh.V, sh.H, device=device) * 0.02).to(dtype)
    model = DFlashDrafter(arch, embed, head).to(device)
    if compiled:
        compile_layers(model)
    return model


def bench_settings(sh: Shapes, device: torch.device) -> LossSettings:
    """The loss every section trains with: the trainer's backend choice for the device."""
    return LossSettings(
        backend=resolve_backend("auto", device),
        block_size=sh.bs,
        gamma=7.0,
        chunk_blocks=128,
        topk=4,
        impl="fused",
    )


def synthetic_blocks(sh: Shapes, device: torch.device, seed: int = 0) -> BlockBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, sh.V - 2, (sh.B, sh.S), generator=g)
    loss_mask = torch.ones(sh.B, sh.S)
    loss_mask[:, : sh.S // 8] = 0  # a prompt
    lengths = torch.full((sh.B,), sh.S, dtype=torch.long)
    anchors, keep = sample_anchors(loss_mask, lengths, sh.N, g)
    batch = Batch(input_ids=ids, loss_mask=loss_mask, lengths=lengths, index=0)
    return BlockBatch(
        batch=batch, anchors=anchors, keep=keep, epoch=0, tokens=int(lengths.sum())
    ).to(device)


def visible_pairs(blocks: BlockBatch, sh: Shapes) -> float:
    a = blocks.anchors[blocks.keep].double()
    return float((a.sum() + blocks.keep.sum() * sh.bs) * sh.bs)


# -- sections --------------------------------------------------------------------------
def section_peak(device: torch.device, small: bool) -> float:
    n = 1024 if small else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = timed(lambda: a @ b, 10, 3, device)
    peak = 2 * n**3 / t
    RESULTS["matmul_peak_tflops"] = peak / 1e12
    row("bf16 matmul peak (8192^3, random data)", f"{peak / 1e12:.0f} TFLOP/s")
    return peak


def section_drafter(sh: Shapes, device: torch.device, peak: float) -> dict[str, float]:
    blocks = synthetic_blocks(sh, device)
    n_feat = sh.n_draft * sh.H
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    features = torch.randn(sh.B, sh.S, n_feat, device=device, dtype=dtype)
    settings = bench_settings(sh, device)
    flops = drafter_flops(sh, visible_pairs(blocks, sh))
    RESULTS["drafter_flops_per_step"] = flops
    out: dict[str, float] = {}
    variants = [("eager", False)] + ([("compiled layers", True)] if device.type == "cuda" else [])
    if device.type == "cuda" and os.environ.get("BENCH_SKIP_EAGER"):
        variants = variants[1:]  # the eager variant's cold flex compile alone takes minutes
    for name, compiled in variants:
        t, first = _time_drafter(sh, device, compiled, blocks, features, settings)
        mfu = flops / t / peak
        toks = sh.B * sh.S / t
        out[name] = t
        RESULTS[f"drafter_{name.replace(' ', '_')}_s"] = t
        row(
            f"drafter fwd+bwd+AdamW, {name} (first call {first:.1f}s)",
            f"{t * 1e3:.1f} ms/step, {toks:,.0f} tok/s, MFU {mfu:.1%}",
            ">= 50 % MFU",
        )
        RESULTS["drafter_mfu"] = max(RESULTS.get("drafter_mfu", 0.0), mfu)
        RESULTS["drafter_tok_s"] = max(RESULTS.get("drafter_tok_s", 0.0), toks)
    return out


def _time_drafter(
    sh: Shapes,
    device: torch.device,
    compiled: bool,
    blocks: BlockBatch,
    features: torch.Tensor,
    settings: LossSettings,
) -> tuple[float, float]:
    """(median s per step, s of the first step including compiles)."""
    model = make_drafter(sh, device, compiled)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=device.type == "cuda"
    )

    def step() -> None:
        with autocast_for(device):
            loss = drafter_loss(model, blocks, features, settings).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    return timed(step, 10, 3, device), first


def _attention_time(q: Any, k: Any, v: Any, grad: Any, mask: Any, device: torch.device) -> float:
    def fwd_bwd() -> None:
        out = attend(q, k, v, mask)
        torch.autograd.grad(out, (q, k, v), grad)

    return timed(fwd_bwd, 5, 2, device)


def section_attention(sh: Shapes, device: torch.device) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    Q = sh.N * sh.bs
    for S in sh.attn_S:
        g = torch.Generator().manual_seed(S)
        loss_mask = torch.ones(1, S)
        anchors, keep = sample_anchors(loss_mask, torch.tensor([S]), sh.N, g)
        anchors, keep = anchors.to(device), keep.to(device)
        q = torch.randn(1, sh.heads, Q, sh.D, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(1, sh.kv, S + Q, sh.D, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(1, sh.kv, S + Q, sh.D, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(1, sh.heads, Q, sh.D, device=device, dtype=dtype)
        times = {}
        for name, make in (("sdpa", make_dense_mask), ("flex", make_block_mask)):
            if name == "flex" and device.type != "cuda":
                continue
            times[name] = _attention_time(q, k, v, grad, make(anchors, keep, S, sh.bs), device)
        if device.type == "cuda":
            build = timed(partial(make_block_mask, anchors, keep, S, sh.bs), 5, 2, device)
            speed = times["sdpa"] / times["flex"]
            RESULTS[f"flex_speedup_{S // 1024}k"] = speed
            RESULTS[f"block_mask_build_ms_{S // 1024}k"] = build * 1e3
            row(
                f"attention fwd+bwd S={S // 1024}k: flex vs dense SDPA",
                f"{times['flex'] * 1e3:.2f} vs {times['sdpa'] * 1e3:.2f} ms = {speed:.2f}x; "
                f"mask build {build * 1e3:.2f} ms",
                ">= 3x at 16k" if S == 16384 else "",
            )
        else:
            row(f"attention fwd+bwd S={S}: dense SDPA", f"{times['sdpa'] * 1e3:.2f} ms")


class CountHead(TorchDispatchMode):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.count = vocab, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm) and (
            out.shape[-1] == self.vocab
        ):
            self.count += 1
        return out


def section_lm_head(sh: Shapes, device: torch.device) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    Q = sh.N * sh.bs
    W = torch.randn(sh.V, sh.H, device=device, dtype=dtype) * 0.02
    hidden = torch.randn(1, Q, sh.H, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, sh.V, (1, Q), device=device)
    weights = torch.rand(1, Q, device=device)

    def naive() -> None:
        logits = (hidden @ W.t()).float()
        ce = torch.nn.functional.cross_entropy(
            logits.view(-1, sh.V), labels.view(-1), reduction="none"
        )
        loss = (ce * weights.view(-1)).sum() / weights.sum()
        loss.backward()

    def chunked(impl: str) -> Any:
        def run() -> None:
            dflash_loss(hidden, W, labels, weights, sh.bs, 128, impl=impl).loss.backward()

        return run

    for name, fn in (
        ("naive full logits", naive),
        ("fused chunks", chunked("fused")),
        ("checkpointed chunks", chunked("checkpoint")),
    ):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = timed(fn, 5, 2, device)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if device.type == "cuda" else 0
        with CountHead(sh.V) as c:
            fn()
        chunks = math.ceil(Q / (128 * sh.bs)) if "chunk" in name else 1
        key = name.split()[0]
        RESULTS[f"lm_head_{key}_ms"] = t * 1e3
        RESULTS[f"lm_head_{key}_peak_gib"] = peak
        RESULTS[f"lm_head_{key}_calls_per_chunk"] = c.count / chunks
        row(
            f"lm_head loss fwd+bwd, {name}",
            f"{t * 1e3:.1f} ms, +{peak:.2f} GiB peak, {c.count} lm_head matmuls / {chunks} "
            "chunk(s)",
        )
        hidden.grad = None


def make_target(sh: Shapes, device: torch.device) -> TargetFeatures:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    layer_ids = default_target_layer_ids(sh.L, sh.n_draft)
    keep = max(layer_ids) + 1
    cfg = Qwen3Config(
        vocab_size=sh.V,
        hidden_size=sh.H,
        intermediate_size=sh.I,
        num_hidden_layers=keep,
        num_attention_heads=sh.heads,
        num_key_value_heads=sh.kv,
        head_dim=sh.D,
        max_position_embeddings=32768,
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval().requires_grad_(False)
    return TargetFeatures(model.model, layer_ids, sh.L)


def section_target(sh: Shapes, device: torch.device, target: TargetFeatures) -> float:
    ids = torch.randint(0, sh.V, (sh.B, sh.S), device=device)
    t = timed(lambda: target(ids), 5, 2, device)
    RESULTS["target_tok_s"] = sh.B * sh.S / t
    kept = len(target.base.layers)  # type: ignore[arg-type]
    row(
        f"target forward, truncated to {kept} of {sh.L} layers, one document a row",
        f"{t * 1e3:.1f} ms/batch, {sh.B * sh.S / t:,.0f} tok/s",
    )
    return t


def packed_rows(sh: Shapes, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first n rows (input_ids, position_ids; on the host) the trainer packs from the
    bundled chat data (`builtin:synthetic-sharegpt`, the bench target's tokenizer) at this
    row length: what a launched 8B run's target forwards."""
    from trainer.builtins.resolve import resolve_data_path
    from trainer.data.packing import collate_packs, epoch_pack_batches
    from trainer.data.tokenized import load_tokenized
    from trainer.targets.tiny import build_tokenizer

    path = resolve_data_path("builtin:synthetic-sharegpt")
    samples = load_tokenized(
        path, build_tokenizer(), max_len=sh.S, warn=lambda _m: None, use_cache=False
    ).samples
    order = epoch_pack_batches(samples, [sh.S], sh.B, 0, 0)
    rows = []
    for i, batch in enumerate(order[:n]):
        b = collate_packs(samples, batch, sh.S, 0, i)
        assert b.position_ids is not None
        rows.append((b.input_ids % sh.V, b.position_ids))
    docs = [int((pos == 0).sum()) for _, pos in rows]
    RESULTS["packed_rows_documents"] = docs
    row("packed rows of the bundled chat data (documents in each)", str(docs))
    return rows


def _flex_docs_kernel() -> Any:
    """flex_attention with a causal document mask, as a packed kernel (a comparison only)."""
    from trainer.model.attention import compiled_flex_attention

    def kernel(query: Any, key: Any, value: Any, docs: Any, scaling: Any) -> Any:
        out = compiled_flex_attention()(
            query, key, value, block_mask=docs, enable_gqa=query.shape[1] != key.shape[1],
            scale=scaling,
        )  # fmt: skip
        return out.transpose(1, 2)

    return kernel


def _flex_block_mask(pos: torch.Tensor, device: torch.device) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    starts = pos == 0
    starts[:, 0] = True
    doc = (torch.cumsum(starts.reshape(-1), 0) - 1).view(pos.shape).to(device, non_blocking=True)

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    B, S = pos.shape
    return create_block_mask(mask_mod, B, None, S, S, device=device, _compile=True)


def section_target_packed(sh: Shapes, device: torch.device, target: TargetFeatures) -> None:
    """The target's forward on packed rows of the bundled data, each way a packed row's
    full attention can keep its documents apart, and with its layers compiled."""
    from trainer.targets.packing import PACKED_KERNELS, PackedDocs, install_packed_attention

    rows = packed_rows(sh)
    on_dev = [(ids.to(device), pos.to(device)) for ids, pos in rows]
    install_packed_attention()
    PACKED_KERNELS["flex"] = _flex_docs_kernel()
    it = iter(range(1 << 30))
    impl = getattr(getattr(target.base, "config", None), "_attn_implementation", None)
    print(f"  target attention implementation: {impl}", flush=True)

    def run(mode: str) -> Callable[[], Any]:
        def fn() -> Any:
            i = next(it) % len(rows)
            ids, pos = on_dev[i]
            if mode == "mask":
                target.packed_attention = "mask"
                return target(ids, pos)
            target.packed_attention = "varlen"
            if mode == "flex":
                target.packed_kernel = "flex"
                return target(ids, pos, _flex_block_mask(rows[i][1], device))
            target.packed_kernel = "varlen"
            return target(ids, pos, PackedDocs.from_positions(rows[i][1], device))

        return fn

    def unpacked() -> Any:
        i = next(it) % len(rows)
        return target(on_dev[i][0])

    modes = ["mask", "varlen", "flex"] if device.type == "cuda" else ["mask"]
    # The same row each way: how far apart the features are (bf16 rounding, ~1e-2).
    ref = None
    for mode in modes:
        it = iter(range(0, 1 << 30, len(rows)))  # row 0
        out = run(mode)().float()
        if ref is None:
            ref = out
        else:
            rel = float((out - ref).norm() / ref.norm())
            RESULTS[f"target_packed_{mode}_vs_mask_rel"] = rel
            print(f"  packed row 0, {mode} vs mask: relative difference {rel:.2e}", flush=True)
    variants: list[tuple[str, Callable[[], Any]]] = [("one document a row", unpacked)]
    variants += [(f"packed, {m}", run(m)) for m in modes]
    times: dict[str, float] = {}
    for name, fn in variants:
        it = iter(range(1 << 30))
        t = timed(fn, 12, 3, device)
        times[name] = t
        key = name.replace(", ", "_").replace(" ", "_")
        RESULTS[f"target_{key}_ms"] = t * 1e3
        row(f"target forward, {name} (eager HF layers)", f"{t * 1e3:.1f} ms/row")
    if device.type != "cuda" or os.environ.get("BENCH_SKIP_TARGET_COMPILE"):
        return
    # As launch compiles them (`target.compile`, TargetFeatures.compile_layers): each decoder
    # layer, one graph for all: RMSNorm, RoPE and SwiGLU fused; varlen stays eager between
    # two graphs (torch.compiler.disable).
    t0 = time.perf_counter()
    from torch._dynamo.utils import counters

    graphs0 = int(counters["stats"]["unique_graphs"])
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    torch._dynamo.config.accumulated_cache_size_limit = max(
        torch._dynamo.config.accumulated_cache_size_limit, 512
    )
    target.compile_layers()
    for name, fn in (("one document a row", unpacked), ("packed, varlen", run("varlen"))):
        it = iter(range(1 << 30))
        first = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        first = time.perf_counter() - first
        t = timed(fn, 12, 3, device)
        key = name.replace(", ", "_").replace(" ", "_")
        RESULTS[f"target_compiled_{key}_ms"] = t * 1e3
        row(
            f"target forward, {name}, compiled layers (first call {first:.1f}s)",
            f"{t * 1e3:.1f} ms/row",
        )
    RESULTS["target_compile_s"] = time.perf_counter() - t0
    graphs = int(counters["stats"]["unique_graphs"]) - graphs0
    RESULTS["target_compiled_graphs"] = graphs
    row("target layers compiled: graphs, seconds", f"{graphs}, {RESULTS['target_compile_s']:.1f}")


def section_optimizer(sh: Shapes, device: torch.device) -> None:
    """The drafter's optimizer stage alone (its ~1B fp32 trainable parameters, gradients
    set): the bytes it must move against the time each way takes. Variants:
      - clip + fused AdamW: `clip_grad_norm_` (a norm, then every gradient scaled in place),
        then fused AdamW: the trainer's stage;
      - folded: the norm only, and fused AdamW divides each gradient by `grad_scale` (the
        clip's inverse coefficient) as it reads it: one pass over the gradients fewer;
      - folded, as a CUDA graph: the same captured once and replayed (capturable AdamW,
        the lr a device tensor): no launches from Python."""
    if device.type != "cuda":
        return
    model = make_drafter(sh, device, compiled=False)
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    g = torch.Generator(device=device).manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, device=device) * 1e-3
    max_norm = 1.0

    def clip_then_step(opt: Any) -> Callable[[], None]:
        def fn() -> None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()

        return fn

    def folded(opt: Any) -> Callable[[], None]:
        def fn() -> None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            opt.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
            opt.step()

        return fn

    results: dict[str, float] = {}
    for name, make in (("clip + fused AdamW (the trainer's)", clip_then_step), ("folded", folded)):
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        results[name] = timed(make(opt), 10, 3, device)
    # The graph: capturable AdamW (its step count on the device), lr a device tensor.
    lr = torch.tensor(1e-4, device=device)
    opt = torch.optim.AdamW(params, lr=lr, fused=True, capturable=True)
    step = folded(opt)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    results["folded, CUDA graph"] = timed(graph.replay, 10, 3, device)
    # Bytes: AdamW reads param, grad, exp_avg, exp_avg_sq and writes three (28 B a param);
    # the norm reads the gradients (4 B); the clip's scaling reads and writes them (8 B).
    floor = {"clip + fused AdamW (the trainer's)": 40 * n, "folded": 32 * n}
    floor["folded, CUDA graph"] = floor["folded"]
    for name, t in results.items():
        key = name.split(" (")[0].replace(", ", "_").replace(" + ", "_").replace(" ", "_")
        RESULTS[f"optimizer_{key}_ms"] = t * 1e3
        row(
            f"optimizer stage alone, {name}, {n / 1e9:.2f}B params",
            f"{t * 1e3:.2f} ms ({floor[name] / t / 1e12:.2f} TB/s of its "
            f"{floor[name] / 1e9:.0f} GB)",
        )


def _profile(label: str, fn: Callable[[], None], n: int) -> dict[str, Any]:
    tl = KernelTimeline()
    tl.start()
    for _ in range(n):
        fn()
    tl.stop()
    out = tl.summary(n)
    if TRACES is not None:
        tl.save(TRACES / f"trace-{label}.json.gz")
    return out


def section_stages(sh: Shapes, device: torch.device, target: TargetFeatures) -> tuple[float, float]:
    """Each pipeline stage alone, exactly as its thread runs it, sustained for seconds:
    the drafter's step (loss, backward, grad clip, AdamW) on a target thread's output, and
    the target's forward plus the mask build. Clocks sampled, 3 steps profiled."""
    from trainer.model.step import attach_mask

    assert SAMPLER is not None
    blocks = synthetic_blocks(sh, device)
    settings = bench_settings(sh, device)
    attach_mask(blocks, settings.backend, sh.bs)
    features = target(blocks.batch.input_ids)
    model = make_drafter(sh, device, compiled=device.type == "cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")

    def drafter_step() -> None:
        with autocast_for(device):
            loss = drafter_loss(model, blocks, features, settings).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def target_step() -> None:
        target(blocks.batch.input_ids)
        attach_mask(blocks, settings.backend, sh.bs)

    n_d = 4 if device.type == "cpu" else 60
    n_t = 4 if device.type == "cpu" else 70
    with SAMPLER.window("drafter alone"):
        t_d = sustained(drafter_step, n_d, device)
    with SAMPLER.window("target alone"):
        t_t = sustained(target_step, n_t, device)
    RESULTS.update(stage_drafter_sustained_s=t_d, stage_target_sustained_s=t_t)
    row(
        f"drafter stage alone, sustained ({n_d} steps, as its thread runs it)",
        f"{t_d * 1e3:.1f} ms/step",
    )
    row(f"target stage alone, sustained ({n_t} batches, + mask build)", f"{t_t * 1e3:.1f} ms")
    RESULTS["timeline_drafter"] = _profile("drafter", drafter_step, 3)
    RESULTS["timeline_target"] = _profile("target", target_step, 3)
    for k in ("drafter", "target"):
        tl = RESULTS[f"timeline_{k}"]
        print(f"  {k} alone, profiled: {_timeline_line(tl)}", flush=True)
    return t_d, t_t


def _timeline_line(tl: dict[str, Any]) -> str:
    if not tl.get("kernels"):
        return "no CUDA kernels recorded"
    streams = ", ".join(f"stream {k} {v:.1f}" for k, v in tl["per_stream_ms"].items())
    return (
        f"per step {tl['wall_ms']:.1f} ms wall, {tl['busy_ms']:.1f} busy, "
        f"{tl['idle_ms']:.1f} idle, kernels {tl['kernel_sum_ms']:.1f} ({streams})"
    )


def section_pipeline(
    sh: Shapes,
    device: torch.device,
    target: TargetFeatures,
    t_drafter: float,
    t_target: float,
    steps: int,
) -> None:
    """The real Pipeline (threads, queues, warm-up) with all roles on this one device."""
    from trainer.config import Config
    from trainer.model.replicas import DrafterReplicas
    from trainer.reporting.runstate import RunState
    from trainer.runtime.setup import RunSetup
    from trainer.runtime.warmup import warm_up
    from trainer.targets.load import LoadedTarget, TargetInfo

    cfg = Config()
    cfg.data.seq_buckets = [sh.S]
    cfg.train.batch_size = sh.B
    cfg.train.num_anchors = sh.N
    cfg.train.log_every = 1_000_000
    cfg.runtime.targets = [str(device)]
    cfg.runtime.drafters = [str(device)]
    g = torch.Generator().manual_seed(1)
    samples = [
        Sample(
            input_ids=torch.randint(0, sh.V - 2, (sh.S,), generator=g).tolist(),
            loss_mask=[0] * (sh.S // 8) + [1] * (sh.S - sh.S // 8),
        )
        for _ in range(64)
    ]
    drafter = make_drafter(sh, device, compiled=device.type == "cuda")
    info = TargetInfo(sh.L, sh.H, sh.heads, sh.kv, sh.D, sh.I, sh.V, 1e-6, 1e6)
    head = drafter.lm_head_weight
    loaded = LoadedTarget(
        features=target,
        embed_weight=drafter.embed_weight,
        lm_head_weight=head,
        info=info,
        layer_ids=list(target.layer_ids),
    )

    class _Tok:
        pad_token_id = 0

    run = RunSetup(
        cfg=cfg,
        target_devices=[device],
        drafter_devices=[device],
        target_path=Path("."),
        targets={device: loaded},
        tokenizer=_Tok(),
        arch=drafter.arch,
        replicas=DrafterReplicas(drafter, [device], {device: (drafter.embed_weight, head)}),
        optimizer=torch.optim.AdamW(
            [p for p in drafter.parameters() if p.requires_grad],
            lr=1e-4,
            fused=device.type == "cuda",
        ),
        samples=samples,
        data_report=LoadReport(len(samples), len(samples), 0, 0),
        batches_per_epoch=64,
        total_steps=steps,
        settings=bench_settings(sh, device),
    )
    state = RunState("bench", steps)
    t0 = time.perf_counter()
    warm_up(run, state)
    warm = time.perf_counter() - t0
    row("single-thread warm-up (compile) in this process", f"{warm:.1f} s")
    RESULTS["warmup_s"] = warm
    default = cfg.runtime.target_stream  # the trainer's default: it names the headline figure
    for target_stream in (default, not default):
        cfg.runtime.target_stream = target_stream
        name = "target stream" if target_stream else "one stream"
        assert SAMPLER is not None
        with SAMPLER.window(f"pipeline, {name}"):
            res = _run_pipeline(
                run,
                state,
                sh,
                device,
                steps,
                t_drafter + t_target,
                name,
                profile=not suffix_of(target_stream, default),
            )
        suffix = suffix_of(target_stream, default)
        RESULTS.update({f"{k}{suffix}": v for k, v in res.items()})


def suffix_of(target_stream: bool, default: bool) -> str:
    """Result keys: plain for the trainer's default stream mode, suffixed for the other."""
    return (
        ""
        if target_stream == default
        else "_" + ("target_stream" if target_stream else "one_stream")
    )


class _SyncRecorder:
    """Host syncs reported by `set_sync_debug_mode("warn")`, each with the stack of the
    thread that synced (warnings are shown on the thread that raised them)."""

    def __init__(self) -> None:
        self.sites: list[str] = []

    def __call__(self, message: Any, category: Any, filename: str, lineno: int, *_: Any) -> None:
        if "synchroniz" not in str(message).lower():
            return
        import traceback

        frames = [
            f"{Path(f.filename).name}:{f.lineno} {f.name}"
            for f in traceback.extract_stack()[:-1]
            if "warnings" not in f.filename
        ]
        where = " <- ".join(reversed(frames[-4:]))
        self.sites.append(f"{threading.current_thread().name}: {where}")


def _run_pipeline(
    run: Any,
    state: Any,
    sh: Shapes,
    device: torch.device,
    steps: int,
    ideal: float,
    name: str,
    profile: bool,
) -> dict[str, Any]:
    from trainer.model.checkpoint import TrainPosition
    from trainer.reporting.steplog import RunLog
    from trainer.runtime.pipeline import Pipeline
    from trainer.runtime.warmup import graphs_compiled

    graphs0 = graphs_compiled()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"dflash-bench-{os.getpid()}-{name[0]}"
    tmp.mkdir(parents=True, exist_ok=True)
    log = RunLog(tmp, echo=False)
    pipe = Pipeline(run, state, log, TrainPosition(0, 0, 0), save_checkpoint=lambda p, loss: None)
    window = (steps // 2, steps // 2 + 10)
    orig = pipe._optimizer_step
    step_ends: list[float] = []

    timeline = KernelTimeline() if profile else None
    prof_window = (steps - 8, steps - 4)  # late: queues full, clocks settled

    def counting_step(s: int, clock: Any) -> None:
        orig(s, clock)
        step_ends.append(time.perf_counter())
        if timeline is not None and s + 1 == prof_window[0]:
            timeline.start()
        if timeline is not None and s + 1 == prof_window[1]:
            timeline.stop()
        if s + 1 == window[0] and device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        if s + 1 == window[1] and device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)

    pipe._optimizer_step = counting_step  # type: ignore[method-assign]
    torch._logging.set_logs(recompiles=True)  # any recompile says why, in the output
    recorder = _SyncRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = recorder  # type: ignore[assignment]
        t0 = time.perf_counter()
        pipe.start()
        outcome = pipe.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
    # Steady state: between the sync-debug window and the profiled one, so neither the
    # bench's own synchronize nor the profiler is in it (the first steps fill the queues).
    a, b = window[1] + 1, prof_window[0] - 2
    per_step = (step_ends[b] - step_ends[a]) / (b - a) if b > a + 4 else total / steps
    # The bench's own set_sync_debug_mode call is reported as a sync: not the trainer's.
    recorder.sites = [x for x in recorder.sites if "set_sync_debug_mode" not in x]
    n_syncs = len(recorder.sites)
    tok_s = sh.B * sh.S / per_step
    # One GPU runs both stages back to back. Against the short CUDA-event bursts of the
    # drafter and target sections (boost clocks, no grad clip), and against the stages run
    # alone for seconds exactly as the threads run them (section_stages): the card is
    # power-capped under sustained load, so only the second compares like with like.
    eff_burst = ideal / per_step
    sustained_ideal = RESULTS.get("stage_drafter_sustained_s", 0) + RESULTS.get(
        "stage_target_sustained_s", 0
    )
    eff = sustained_ideal / per_step if sustained_ideal else eff_burst
    recompiles = graphs_compiled() - graphs0
    row(
        f"threaded pipeline, {name}, all roles on one device, {steps} steps ({outcome})",
        f"{tok_s:,.0f} tok/s steady ({steps * sh.B * sh.S / total:,.0f} overall); "
        f"efficiency {eff:.1%} of the stages alone, sustained ({eff_burst:.1%} of the "
        "burst figures)",
        ">= 95 %",
    )
    row(f"recompiles during the pipeline steps after warm-up ({name})", str(recompiles), "0")
    row(
        f"host syncs per steady-state step ({name}; sync debug mode, 10 steps)",
        f"{n_syncs / (window[1] - window[0]):.1f}",
        "0",
    )
    extra: dict[str, Any] = {}
    if timeline is not None:
        extra["timeline_pipeline"] = tl = timeline.summary(prof_window[1] - prof_window[0])
        print(f"  pipeline ({name}), profiled: {_timeline_line(tl)}", flush=True)
        if TRACES is not None:
            timeline.save(TRACES / "trace-pipeline.json.gz")
    sites = sorted(set(recorder.sites))
    for site in sites[:8]:
        print("   host sync:", site, flush=True)
    return {
        "pipeline_tok_s": tok_s,
        "pipeline_efficiency": eff,
        "pipeline_efficiency_vs_burst": eff_burst,
        "pipeline_overall_tok_s": steps * sh.B * sh.S / total,
        "recompiles_after_warmup": recompiles,
        "host_syncs_per_step": n_syncs / (window[1] - window[0]),
        "host_sync_sites": sites,
        "pipeline_outcome": outcome,
        **extra,
    }


def compile_report(path: Path) -> None:
    """Where the compile time went (dynamo's timers), the slowest stages printed, all saved."""
    from torch._dynamo.utils import compilation_time_metrics

    from trainer.runtime.warmup import compile_breakdown, compile_cache_counts

    path.write_text(json.dumps(compilation_time_metrics, indent=1, default=str))
    RESULTS["compile_breakdown_s"] = compile_breakdown(8)
    RESULTS["compile_cache"] = compile_cache_counts()
    print("  compile stages (s):", RESULTS["compile_breakdown_s"], flush=True)
    print("  compile cache:", RESULTS["compile_cache"], flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    p.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="peak drafter attention lm_head target target_packed optimizer pipeline",
    )
    p.add_argument("--pipeline-steps", type=int, default=200)
    p.add_argument("--trace-dir", type=Path, help="save gzipped Chrome traces of profiled steps")
    args = p.parse_args()
    global SAMPLER, TRACES
    SAMPLER = GpuSampler()
    TRACES = args.trace_dir
    if TRACES is not None:
        TRACES.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sh = Shapes(args.small)
    RESULTS.update(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        small=args.small,
    )
    want = set(
        args.only
        or ["peak", "drafter", "attention", "lm_head", "target", "target_packed", "pipeline"]
    )
    print(f"device {RESULTS['device']}, torch {torch.__version__}", flush=True)
    peak = section_peak(device, args.small) if "peak" in want else 790e12
    save(args.out)
    t_drafter = t_target = 0.0
    if "drafter" in want or "pipeline" in want:
        # A cold compile past 4 minutes has happened here: show where it is, every minute.
        faulthandler.dump_traceback_later(240, repeat=True)
        times = section_drafter(sh, device, peak)
        faulthandler.cancel_dump_traceback_later()
        t_drafter = min(times.values())
        save(args.out)
        compile_report(args.out.with_name("compile_times.json"))
    if "optimizer" in want:
        section_optimizer(sh, device)
        save(args.out)
    if "attention" in want:
        section_attention(sh, device)
        save(args.out)
    if "lm_head" in want:
        section_lm_head(sh, device)
        save(args.out)
    if "target" in want or "pipeline" in want or "target_packed" in want:
        target = make_target(sh, device)
        t_target = section_target(sh, device, target)
        save(args.out)
        if "target_packed" in want:
            section_target_packed(sh, device, target)
            save(args.out)
        if "pipeline" in want:
            section_stages(sh, device, target)
            save(args.out)
            section_pipeline(sh, device, target, t_drafter, t_target, args.pipeline_steps)
            RESULTS["gpu_clocks"] = SAMPLER.windows
            for label, w in SAMPLER.windows.items():
                print(f"  clocks, {label}: {w}", flush=True)
            save(args.out)
    print("\n| what | figure | target |\n|---|---|---|")
    for what, figure, goal in ROWS:
        print(f"| {what} | {figure} | {goal} |")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench-main"
    sys.exit(main())
