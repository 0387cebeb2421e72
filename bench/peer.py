"""SpecForge 0.2.0's own DFlash training step against ours, same shapes, one GPU.

    python3 bench/peer.py [--steps 20] [--out peer.json]      # on the GPU
    python3 bench/peer.py --small                             # a CPU smoke test

SpecForge's step as its trainer runs it, from its own modules (specforge is installed
without its dependencies; only torch and transformers are imported): `DFlashDraftModel`
(a Qwen3Config of 5 layers, block 16, flex attention through transformers' integration),
wrapped with its loss in `OnlineDFlashModel` (512 anchors, gamma 7, 128-block checkpointed
loss chunks), `FSDPTrainingBackend` with SHARD_GRAD_OP over a 1-rank NCCL group, and
`BF16Optimizer` (AdamW over fp32 master copies, grad clip 0.5): per step its forward and
loss, `backend.backward`, `backend.step` (clip, AdamW, copy back). Ours: the trainer's
drafter thread's step (compiled layers, fused chunk loss, backward, clip, fused AdamW).

The target: transformers' own forward with `output_hidden_states` over the 36 layers of
the Qwen3-8B shape (`logits_to_keep=1`: the hidden states are what is wanted, as in
SpecForge's `spec_generate`), the 5 chosen layers concatenated as SpecForge's
`extract_context_feature` does; against ours (`TargetFeatures`: the layers up to the
deepest chosen one, 34 of 36, called directly).

Same shapes for both: Qwen3-8B (hidden 4096, 32/8 heads, vocab 151,936), one 4096-token
row (the first eighth a prompt: no loss there), random weights and features. Each figure:
the median of `--steps` (>= 20) CUDA-event times of whole steps after warm-up (compiles
included in the warm-up), each step timed from an idle GPU. The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from gpu_bench import Shapes, bench_settings, make_drafter, synthetic_blocks  # noqa: E402

from trainer.model.step import drafter_loss  # noqa: E402
from trainer.runtime.pipeline import autocast_for  # noqa: E402
from trainer.targets.load import TargetFeatures, default_target_layer_ids  # noqa: E402

ROWS: list[tuple[str, str]] = []
RESULTS: dict[str, Any] = {}


def row(what: str, figure: str) -> None:
    ROWS.append((what, figure))
    print(f"  {what}: {figure}", flush=True)


def per_step(fn: Callable[[], Any], steps: int, warmup: int, device: torch.device) -> float:
    """Median seconds of one call, each timed alone (CUDA events; the host clock on CPU)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
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
    return statistics.median(times)


def init_one_rank(device: torch.device) -> None:
    """A process group of one rank: NCCL on the GPU (FSDP's), gloo on the CPU."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
    )


# -- the target ------------------------------------------------------------------------
def section_target(sh: Shapes, device: torch.device, steps: int) -> None:
    from specforge.modeling.draft.dflash import extract_context_feature
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = Qwen3Config(
        vocab_size=sh.V,
        hidden_size=sh.H,
        intermediate_size=sh.I,
        num_hidden_layers=sh.L,
        num_attention_heads=sh.heads,
        num_key_value_heads=sh.kv,
        head_dim=sh.D,
        max_position_embeddings=40960,
    )
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(old)
    layer_ids = default_target_layer_ids(sh.L, sh.n_draft)
    ours = TargetFeatures(model.model, layer_ids, sh.L)
    ids = torch.randint(0, sh.V, (sh.B, sh.S), device=device)

    @torch.no_grad()
    def hf() -> Any:
        out = model(ids, output_hidden_states=True, logits_to_keep=1)
        return extract_context_feature(out.hidden_states, layer_ids)

    a, b = hf(), ours(ids)
    rel = float((a.float() - b.float()).norm() / b.float().norm())
    t_hf = per_step(hf, steps, 3, device)
    t_ours = per_step(lambda: ours(ids), steps, 3, device)
    RESULTS.update(target_hf_ms=t_hf * 1e3, target_ours_ms=t_ours * 1e3, target_rel_diff=rel)
    row(
        f"target, transformers' forward with output_hidden_states ({sh.L} layers)",
        f"{t_hf * 1e3:.1f} ms",
    )
    row(
        f"target, ours (TargetFeatures: {len(model.model.layers) - (sh.L - max(layer_ids) - 1)}"
        f" layers, called directly)",
        f"{t_ours * 1e3:.1f} ms = {t_hf / t_ours:.2f}x faster (features equal to {rel:.1e})",
    )


# -- SpecForge's drafter step ------------------------------------------------------------
def specforge_step(
    sh: Shapes, device: torch.device, features: torch.Tensor, blocks: Any, small: bool
) -> Callable[[], None]:
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.optimizer import BF16Optimizer
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from transformers import Qwen3Config

    from trainer.evaluation.export import serving_config
    from trainer.model.drafter import DrafterArch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
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
    # The draft config SpecForge and SGLang read (our export writes the same one).
    config = Qwen3Config(**serving_config(arch, sh.L, 40960, "bfloat16", None))
    # SpecForge's build_dflash_draft: the attention backend is the config's implementation.
    config._attn_implementation = "sdpa" if small else "flex_attention"
    with torch.device(device):
        draft = DFlashDraftModel(config).to(dtype)
        head = torch.nn.Linear(sh.H, sh.V, bias=False).to(dtype).requires_grad_(False)
        embed = torch.nn.Embedding(sh.V, sh.H).to(dtype).requires_grad_(False)
    model = OnlineDFlashModel(
        draft_model=draft,
        target_lm_head=head,
        target_embed_tokens=embed,
        mask_token_id=sh.V - 1,
        block_size=sh.bs,
        attention_backend="sdpa" if small else "flex_attention",
        num_anchors=sh.N,
        loss_decay_gamma=7.0,
        objective_chunk_blocks=128,
    ).to(device=device, dtype=dtype)

    def optimizer(target: Any) -> Any:
        return BF16Optimizer(target, lr=6e-4, max_grad_norm=0.5, total_steps=10_000)

    backend = FSDPTrainingBackend(
        ParallelConfig.from_distributed(sharding_strategy="SHARD_GRAD_OP", param_dtype=dtype),
        optimizer_factory=optimizer,
    )
    # FSDP1 wants a GPU: the CPU smoke test runs the same step unwrapped.
    wrapped = backend.prepare_model(model, optimizer_target=model.draft_model, wrap=not small)
    RESULTS["specforge_wrapper"] = backend._wrapper_kind
    ids = blocks.batch.input_ids
    loss_mask = blocks.batch.loss_mask.to(dtype)
    hidden = features.to(dtype)

    def step() -> None:
        loss, _acc, _metrics = wrapped(input_ids=ids, hidden_states=hidden, loss_mask=loss_mask)
        backend.backward(loss)
        backend.step()

    return step


def our_step(
    sh: Shapes, device: torch.device, features: torch.Tensor, blocks: Any
) -> Callable[[], None]:
    """The drafter thread's step: loss, backward, clip, fused AdamW, zero_grad."""
    from trainer.model.step import attach_mask

    settings = bench_settings(sh, device)
    attach_mask(blocks, settings.backend, sh.bs)
    model = make_drafter(sh, device, compiled=device.type == "cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=6e-4, fused=device.type == "cuda")

    def step() -> None:
        with autocast_for(device):
            loss = drafter_loss(model, blocks, features, settings).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def section_drafter(sh: Shapes, device: torch.device, steps: int, small: bool) -> None:
    blocks = synthetic_blocks(sh, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    features = torch.randn(sh.B, sh.S, sh.n_draft * sh.H, generator=g, device=device, dtype=dtype)
    times: dict[str, float] = {}
    for name, make in (
        ("SpecForge 0.2.0", lambda: specforge_step(sh, device, features, blocks, small)),
        ("ours", lambda: our_step(sh, device, features, blocks)),
    ):
        t0 = time.perf_counter()
        step = make()
        step()  # compiles happen here
        if device.type == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
        times[name] = t = per_step(step, steps, 3, device)
        RESULTS[f"drafter_{name.split()[0].lower()}_ms"] = t * 1e3
        row(
            f"drafter step, {name} (build + first step {first:.1f}s)",
            f"{t * 1e3:.1f} ms, {sh.B * sh.S / t:,.0f} tok/s",
        )
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ratio = times["SpecForge 0.2.0"] / times["ours"]
    RESULTS["drafter_ratio"] = ratio
    row("drafter step, SpecForge / ours", f"{ratio:.2f}x")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke test)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--only", nargs="*", default=["target", "drafter"])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    sh = Shapes(args.small)
    import specforge
    import transformers

    RESULTS.update(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        transformers=transformers.__version__,
        specforge=getattr(specforge, "__version__", "0.2.0"),
        date=time.strftime("%Y-%m-%d"),
        steps=args.steps,
    )
    print(
        f"device {RESULTS['device']}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}",
        flush=True,
    )
    init_one_rank(device)
    try:
        if "target" in args.only:
            section_target(sh, device, args.steps)
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the 16 GB target, gone with the section
        if "drafter" in args.only:
            section_drafter(sh, device, args.steps, args.small)
    finally:
        if args.out:
            args.out.write_text(json.dumps(RESULTS, indent=1) + "\n")
        dist.destroy_process_group()
    print("\n| what | figure |\n|---|---|")
    for what, figure in ROWS:
        print(f"| {what} | {figure} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
