"""The held-out eval's decode on the 8B shape, three ways: one prompt at a time (speculative.py's
loop, what the eval thread ran before issue 31), the prompts as one batch run eagerly, and the
batch with its step replayed as a CUDA graph (trainer/evaluation/decoding.py, what it runs now).

    python3 bench/eval_bench.py                 # a GPU: the 8B-shaped random target, 8 prompts
                                                # of 480-512 tokens x 64 new tokens, block 16
    python3 bench/eval_bench.py --load          # each beside a matmul load on its own stream,
                                                # launched from Python (the SMs and the GIL
                                                # shared, as beside training)
    .venv/bin/python bench/eval_bench.py --small    # CPU smoke test: tiny shapes, no graphs
    python3 bench/eval_bench.py --profile       # then each batched mode once under
                                                # torch.profiler: the GPU's kernel time by
                                                # kernel, against the wall (what an eval
                                                # takes from training on a shared GPU)

The target is built in memory with random weights (bench/make_bench_target.py's shape, all 36
layers: the eval verifies with the whole target), the drafter too (5 layers, DFlash's spread of
target layers). Random weights make a degenerate decode (τ near 1): what is compared is the
time and that the three give the same tokens and τ. Each batched mode runs once first (the
graph mode captures then; its time is reported apart), then `--repeats` times (the median).
The per-prompt loop runs once. Prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from eval_contention import load_thread  # noqa: E402  (bench/)
from make_bench_target import qwen3_8b_config  # noqa: E402  (bench/)
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from trainer.evaluation.decoding import HeldOutDecode, one_at_a_time  # noqa: E402
from trainer.evaluation.speculative import Decoded, drafter_proposer  # noqa: E402
from trainer.model.drafter import DFlashDrafter, DrafterArch  # noqa: E402
from trainer.targets.load import default_target_layer_ids  # noqa: E402

ROWS: list[tuple[str, ...]] = []


def build(small: bool, device: torch.device) -> tuple[Any, DFlashDrafter]:
    if small:
        cfg = Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
        )  # fmt: skip
        n_draft, block = 2, 8
    else:
        cfg, n_draft, block = qwen3_8b_config(), 5, 16
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(old)
    layers = default_target_layer_ids(cfg.num_hidden_layers, n_draft)
    arch = DrafterArch(
        hidden_size=cfg.hidden_size, num_layers=n_draft, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=10000.0, block_size=block,
        mask_token_id=cfg.vocab_size - 1, target_layer_ids=tuple(layers),
    )  # fmt: skip
    embed = model.get_input_embeddings().weight
    drafter = DFlashDrafter(arch, embed, model.get_output_embeddings().weight)
    return model, drafter.to(device=device, dtype=dtype).eval()


def prompts_of(small: bool, vocab: int) -> list[list[int]]:
    """8 prompts of different lengths (the batch pads them), as held-out chat prompts are."""
    g = torch.Generator().manual_seed(1)
    longest = 40 if small else 512
    return [torch.randint(0, vocab - 8, (longest - 4 * i,), generator=g).tolist() for i in range(8)]


def timed(run: Any, device: torch.device) -> tuple[Decoded, float]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.monotonic()
    out = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.monotonic() - t0


def report(
    name: str,
    seconds: list[float],
    first_s: float | None,
    d: Decoded,
    ref: Decoded | None,
    forwards: int,
    extra: str = "",
) -> dict[str, Any]:
    """A row: the median run, the first (a graph's capture), the verify steps every prompt
    took (the same for all modes) and the target forwards that did them."""
    total = d.total()
    same = sum(a == b for a, b in zip(d.tokens, ref.tokens, strict=True)) if ref else len(d.tokens)
    median = statistics.median(seconds)
    s = total.summary()
    row = {
        "mode": name, "seconds": round(median, 3), "runs": [round(x, 3) for x in seconds],
        "first_run_s": round(first_s, 3) if first_s is not None else None,
        "verify_steps": s["verify_steps"], "forwards": forwards, "tokens": s["tokens"],
        "tok_s": round(s["tokens"] / median, 1), "tau": s["tau"],
        "per_position": s["per_position"][:4], "same_tokens": f"{same} of {len(d.tokens)}",
    }  # fmt: skip
    first = f"{first_s:.2f}" if first_s is not None else "-"
    steps = f"{s['verify_steps']} / {forwards}"
    ROWS.append((name, f"{median:.2f}", first, steps, f"{row['tok_s']:.1f}",
                 f"{s['tau']}", row["same_tokens"], extra))  # fmt: skip
    print(f"  {name}: {row}", flush=True)
    return row


def profile_run(decode: HeldOutDecode, device: torch.device, name: str) -> dict[str, Any]:
    """One more run under torch.profiler: the kernels' summed time against the wall, and the
    kernels that take most of it (a CUDA graph's replays are traced kernel by kernel)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        _, wall = timed(decode.run, device)
    by_kernel: dict[str, float] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            key = e.name[:90]
            by_kernel[key] = by_kernel.get(key, 0.0) + e.device_time_total / 1e3
    if device.type == "cuda" and name.endswith("eager"):  # the ops behind the kernels
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=40,
            max_shapes_column_width=70,
        )  # fmt: skip
        print("\n".join(f"  OPS {line}" for line in table.splitlines()), flush=True)
    total = sum(by_kernel.values())
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
    print(
        f"  PROFILE {name}: wall {wall * 1e3:.0f} ms, kernels {total:.0f} ms "
        f"({len(by_kernel)} kinds)",
        flush=True,
    )
    for k, ms in top:
        print(f"  PROFILE   {ms:8.1f} ms  {k}", flush=True)
    return {"wall_ms": round(wall * 1e3, 1), "kernel_ms": round(total, 1),
            "top": [[k, round(ms, 2)] for k, ms in top]}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--load", action="store_true", help="beside a matmul load thread (GPU)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="the rows as JSON")
    p.add_argument("--profile", action="store_true", help="kernel time of one run of each mode")
    p.add_argument("--no-loop", action="store_true", help="skip the one-prompt-at-a-time loop")
    p.add_argument("--eager-only", action="store_true", help="no CUDA-graph mode")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    t0 = time.monotonic()
    model, drafter = build(args.small, device)
    prompts = prompts_of(args.small, model.config.vocab_size)
    new, bs = args.new_tokens, drafter.arch.block_size
    built = time.monotonic() - t0
    lengths = [len(x) for x in prompts]
    print(f"device {device}, torch {torch.__version__}; built in {built:.1f}s; prompts {lengths}")
    stop = threading.Event()
    if args.load and device.type == "cuda":
        threading.Thread(target=load_thread, args=(stop, True), daemon=True).start()
        time.sleep(1.0)
    # The eval thread's stream: its own, at priority -1 (trainer/evaluation/online.py).
    stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
    results: list[dict[str, Any]] = []
    on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with on_stream, torch.no_grad():
        layer_ids = list(drafter.arch.target_layer_ids)
        propose = drafter_proposer(drafter)
        one_at_a_time(model, layer_ids, propose, prompts[:1], 4, bs)  # warm
        ref: Decoded | None = None
        if not args.no_loop:
            ref, t = timed(
                lambda: one_at_a_time(model, layer_ids, propose, prompts, new, bs), device
            )
            steps = len(ref.total().accepted)
            results.append(report("one prompt at a time (before)", [t], None, ref, None, steps))
        modes = [("batched, eager", "off")]
        if device.type == "cuda" and not args.eager_only:
            modes.append(("batched, CUDA graph", "on"))
        for name, graphs in modes:
            decode = HeldOutDecode(model, drafter, prompts, new, graphs, log=print)
            first, first_s = timed(decode.run, device)
            runs = [timed(decode.run, device) for _ in range(args.repeats)]
            g = decode.graphs
            extra = (f"captured {g.captured}, replays {g.replays}, failed {g.failed}"
                     if g.enabled else "")  # fmt: skip
            last = runs[-1][0]
            forwards = max(len(r.accepted) for r in last.rows)  # the batch steps together
            row = report(name, [t for _, t in runs], first_s, last, ref, forwards, extra)
            row["graphs"] = {"captured": g.captured, "replays": g.replays, "failed": g.failed,
                             "failures": [f.reason for f in g.failures]}  # fmt: skip
            row["first_same_as_last"] = first.tokens == last.tokens
            if args.profile:
                row["profile"] = profile_run(decode, device, name)
            results.append(row)
    stop.set()
    if device.type == "cuda":
        row0 = {"max_memory_allocated_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2)}
        print(f"  {row0}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    load = ", beside a matmul load" if args.load else ""
    print(f"\n{len(prompts)} prompts x {new} new tokens, block {bs}, {device}{load}")
    print(
        "| mode | s (median) | first run s | verify steps / target forwards | tok/s | τ |"
        " tokens as before | graphs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
