"""The target in FP8 (`target.dtype = "fp8"`) against bf16 on a GPU: the features' error per
layer the drafter reads, and the forward's time on a packed 4096-token row, eager and
compiled (`target.compile`).

    python3 bench/fp8_target.py --out fp8.json                  # the 8B shape, random weights
    python3 bench/fp8_target.py --target DIR --out fp8.json     # a target folder, bf16 or FP8
    python3 bench/fp8_target.py --target DIR --device cpu --no-compile --reps 1 --out x.json

Without `--target`: the Qwen3-8B bench shape (bench/make_bench_target.py), built on the GPU
with HF's random init (no disk), truncated as training truncates it (layers 0..33 for the
8B config's 5-layer drafter), through the trainer's own `TargetFeatures`; the FP8 twin is
the same weights quantised row-wise (`convert_linears`). With `--target`: both loaded by
`load_target`, the bf16 one as `target.dtype = "bfloat16"` loads it (a checkpoint in
transformers' FP8 format: its dequantised weights, so the error shown is the activations'
and the requantisation's alone). Random weights have none of a trained model's outlier
activations: the error on a real model is the operator's to measure (README).

Prints `FP8 ...` lines and writes everything to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_bench_target import qwen3_8b_config

from trainer.targets.fp8 import check_fp8_device, convert_linears
from trainer.targets.load import (
    TargetFeatures,
    default_target_layer_ids,
    load_target,
    read_target_info,
    resolve_packed_attention,
)

# A packed row of chat-like documents, as the pipeline packs them (position ids restart).
DOC_LENGTHS = (1536, 1024, 768, 512, 256)


def weight_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def in_memory(layer_ids: list[int], dev: torch.device) -> tuple[TargetFeatures, TargetFeatures]:
    from transformers import Qwen3ForCausalLM

    config = qwen3_8b_config()
    full = config.num_hidden_layers
    config.num_hidden_layers = max(layer_ids) + 1
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU: no fp32 copy
    try:
        with torch.device(dev):
            model: Any = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.eval().requires_grad_(False)
    twin: Any = copy.deepcopy(model)
    convert_linears(twin.model.layers)
    packed = resolve_packed_attention("auto", dev, torch.bfloat16)
    if model.config._attn_implementation != "sdpa":  # varlen is reached through HF's "sdpa"
        packed = "mask"
    return (
        TargetFeatures(model.model, layer_ids, full, packed),
        TargetFeatures(twin.model, layer_ids, full, packed),
    )


def from_folder(
    folder: Path, layer_ids: list[int], dev: torch.device
) -> tuple[TargetFeatures, TargetFeatures]:
    bf16 = load_target(folder, layer_ids, torch.bfloat16, dev, "auto")
    fp8 = load_target(folder, layer_ids, torch.bfloat16, dev, "auto", fp8=True)
    return bf16.features, fp8.features  # type: ignore[return-value]


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn: Callable[[], object], reps: int, dev: torch.device) -> float:
    """Median ms of `reps` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def layers_of(f: TargetFeatures) -> torch.nn.Module:
    layers: Any = f.base.layers
    return layers


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, help="a target folder (default: the 8B shape)")
    p.add_argument("--draft-layers", type=int, default=5, help="the drafter's layers (spread)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--no-compile", action="store_true", help="eager forwards only")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda", help="cpu: the error alone, with --target")
    args = p.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cpu" and not args.target:
        print("error: --device cpu needs --target (the 8B shape is for a GPU)", file=sys.stderr)
        return 2
    try:
        if dev.type != "cpu":  # the CPU: torch's reference _scaled_mm, errors only
            check_fp8_device("fp8", dev)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    num_layers = (
        read_target_info(args.target).num_layers
        if args.target
        else qwen3_8b_config().num_hidden_layers
    )
    layer_ids = default_target_layer_ids(num_layers, args.draft_layers)
    t0 = time.time()
    if args.target:
        bf16, fp8 = from_folder(args.target, layer_ids, dev)
    else:
        bf16, fp8 = in_memory(layer_ids, dev)
    config: Any = bf16.base.config  # HF's model config (an nn.Module attribute to mypy)
    hidden = int(config.hidden_size)
    print(f"FP8 built in {time.time() - t0:.1f}s; layers read {layer_ids}", flush=True)

    seq = sum(DOC_LENGTHS)
    g = torch.Generator().manual_seed(0)
    vocab = int(config.vocab_size)
    ids = torch.randint(0, vocab, (1, seq), generator=g).to(dev)
    pos = torch.cat([torch.arange(n) for n in DOC_LENGTHS])[None]
    docs = bf16.packed_docs(pos, dev)
    pos = pos.to(dev)

    def forward(f: TargetFeatures) -> torch.Tensor:
        return f(ids, pos, docs)

    want, got = forward(bf16).float(), forward(fp8).float()
    errors = {}
    for i, layer in enumerate(layer_ids):
        a, b = got[..., i * hidden : (i + 1) * hidden], want[..., i * hidden : (i + 1) * hidden]
        errors[layer] = float((a - b).norm() / b.norm())
    cosine = float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "target": str(args.target) if args.target else "qwen3-8b shape, random weights",
        "layers_read": layer_ids,
        "seq": seq,
        "docs": list(DOC_LENGTHS),
        "packed_attention": bf16.packed_attention,
        "weights_gb": {
            "bf16": weight_bytes(layers_of(bf16)) / 1e9,
            "fp8": weight_bytes(layers_of(fp8)) / 1e9,
        },
        "feature_rel_error": errors,
        "feature_cosine": cosine,
        "forward_ms": {},
    }
    modes = ["eager"] if args.no_compile else ["eager", "compiled"]
    for mode in modes:
        for name, f in (("bf16", bf16), ("fp8", fp8)):
            if mode == "compiled" and f.compiled is None:
                t1 = time.time()
                f.compile_layers()
                forward(f)
                sync(dev)
                result.setdefault("compile_s", {})[name] = time.time() - t1
            ms = timed(functools.partial(forward, f), args.reps, dev)
            result["forward_ms"][f"{name}_{mode}"] = ms
        if mode == "compiled":  # the compiled FP8 forward against the compiled bf16 one
            c_err = (forward(fp8).float() - forward(bf16).float()).norm() / want.norm()
            result["compiled_feature_rel_error"] = float(c_err)
    if dev.type == "cuda":
        result["peak_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9

    print("FP8 layer  rel_error (features, FP8 vs bf16)")
    for layer, err in errors.items():
        print(f"FP8 {layer:5d}  {err:.4f}")
    print(f"FP8 cosine(all read features) {cosine:.6f}")
    w = result["weights_gb"]
    print(f"FP8 decoder weights: bf16 {w['bf16']:.3f} GB, fp8 {w['fp8']:.3f} GB")
    print(f"FP8 forward of one packed {seq}-token row (median of {args.reps}):")
    for mode in modes:
        b, f8 = result["forward_ms"][f"bf16_{mode}"], result["forward_ms"][f"fp8_{mode}"]
        print(f"FP8 {mode:9s} bf16 {b:8.2f} ms  fp8 {f8:8.2f} ms  fp8/bf16 {f8 / b:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"FP8 wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
