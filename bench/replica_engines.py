"""DDP or FSDP2 for processes mode's drafter replicas: step time and memory per rank.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/replica_engines.py \
        [--shape tiny|wide] [--steps 12] [--rounds 3] [--out r.json]

Each rank trains its own replica of the drafter (bench/gpu_bench.py's shapes, the loss the
trainer trains with) on its own synthetic batch, gloo on CPU, under three engines:

  flat   the hand-written reduce processes mode had before DDP: after backward, every
         gradient flattened into one fp32 buffer, one all_reduce, copied back (kept here
         only, as the baseline; the trainer no longer has it)
  ddp    torch's DistributedDataParallel over the ranks, its buckets all-reduced while
         backward runs (what trainer/distributed/replica_sync.py uses)
  fsdp2  torch's fully_shard on each drafter layer and the whole: parameters, gradients
         and AdamW state sharded over the ranks, gathered per layer for forward/backward

Per engine: the median step (forward, backward with the engine's reduce, AdamW step,
zero_grad) over `--steps` after 2 warm-up steps, the slowest rank's, its median over
`--rounds` rounds of the engines in turn, and each rank's bytes of trainable
parameters + gradients + AdamW state as the tensors it holds say after backward (the
sharding's saving; the frozen embedding and lm_head are the same for all three and left
out; FSDP2's transient per-layer gather is not in it). Rank 0 prints the table and writes
`--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from gpu_bench import Shapes, bench_settings, make_drafter, synthetic_blocks  # noqa: E402
from torch import nn  # noqa: E402

from trainer.model.step import drafter_loss  # noqa: E402


def shapes(name: str) -> Shapes:
    sh = Shapes(True)
    if name == "wide":  # more parameters per FLOP: where a reduce or a shard shows
        sh.H, sh.heads, sh.kv, sh.D, sh.I, sh.V, sh.n_draft = 512, 8, 2, 64, 1536, 4096, 3
    return sh


class DrafterLoss(nn.Module):
    """The whole loss as one forward, so DDP and FSDP2 see every use of the parameters."""

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, blocks: Any, features: torch.Tensor, settings: Any) -> Any:
        return drafter_loss(self.drafter, blocks, features, settings)  # type: ignore[arg-type]


def flat_reduce(params: list[nn.Parameter], world: int) -> None:
    """The old hand-written reduce: one flat fp32 all_reduce after backward, then / world."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= float(world)
    torch._foreach_copy_(grads, list(torch._utils._unflatten_dense_tensors(flat, grads)))


def local_bytes(t: torch.Tensor) -> int:
    """What this rank holds of `t` (a DTensor's local shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def run_engine(engine: str, sh: Shapes, steps: int) -> dict[str, float]:
    torch.manual_seed(0)  # every rank the same replica
    device = torch.device("cpu")
    drafter = make_drafter(sh, device, compiled=False)
    model: nn.Module = DrafterLoss(drafter)
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, init_sync=False, gradient_as_bucket_view=True)
    elif engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in drafter.layers:
            fully_shard(layer)
        fully_shard(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    settings = bench_settings(sh, device)
    blocks = synthetic_blocks(sh, device, seed=dist.get_rank())  # each rank its own batch
    g = torch.Generator().manual_seed(dist.get_rank())
    features = torch.randn(sh.B, sh.S, sh.n_draft * sh.H, generator=g)
    times, losses = [], []
    for i in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        out = model(blocks, features, settings)
        out.loss.backward()
        if engine == "flat":
            flat_reduce(params, dist.get_world_size())
        held = sum(local_bytes(p) + local_bytes(p.grad) for p in params if p.grad is not None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - t0)
        losses.append(float(out.loss.detach()))
    state = sum(local_bytes(v) for s in opt.state.values() for v in s.values() if v.dim() > 0)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "params_grads_optimizer_mb": (held + state) / 2**20,
        "last_loss": losses[-1],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=["tiny", "wide"], default="wide")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--engines", default="flat,ddp,fsdp2")
    p.add_argument("--rounds", type=int, default=3, help="each engine's runs, interleaved")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sh = shapes(args.shape)
    results: dict[str, Any] = {"shape": args.shape, "world": dist.get_world_size()}
    engines = args.engines.split(",")
    for _ in range(args.rounds):  # interleaved: the box's load drifts over all of them
        for engine in engines:
            mine = run_engine(engine, sh, args.steps)
            every: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            r = results.setdefault(engine, {"rounds_ms": []})
            r["rounds_ms"].append(max(e["step_ms"] for e in every))  # the slowest rank's
            r["params_grads_optimizer_mb"] = max(e["params_grads_optimizer_mb"] for e in every)
            r["last_loss"] = every[0]["last_loss"]
    for engine in engines:
        results[engine]["step_ms"] = statistics.median(results[engine]["rounds_ms"])
    if dist.get_rank() == 0:
        base = results.get("flat", {}).get("step_ms")
        print(
            f"{args.shape}: {dist.get_world_size()} ranks, gloo, median of {args.rounds} "
            f"rounds of {args.steps} steps each (a round: the median step)"
        )
        for engine in args.engines.split(","):
            r = results[engine]
            ratio = f" ({r['step_ms'] / base:.2f}x flat)" if base else ""
            print(
                f"  {engine:6s} step {r['step_ms']:8.1f} ms{ratio}   "
                f"params+grads+AdamW per rank {r['params_grads_optimizer_mb']:7.2f} MB   "
                f"last loss {r['last_loss']:.4f}"
            )
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
