"""Compile before the threads start: one thread, gradients on, every shape bucket.

A cold `torch.compile(flex_attention)` entered from several threads at once deadlocked on
the H200 (torch 2.11: > 150 s, every thread in dynamo's convert_frame). Warmed up on one
thread first (23 s), four threads then ran with 0 recompiles. So the main thread runs a full
forward+backward per (drafter device, bucket) before any worker starts, and the heartbeat
reports graphs compiled afterwards as recompiles.

Only a CUDA device compiles (the drafter's layers, its loss math, flex attention: each on
CUDA only), so a CPU run has nothing to warm up, and nothing here imports torch._dynamo for
it (7 s of a warm demo's start on a loaded 2-core host, 1.6 s idle). torch.optim still does,
at the optimizer's creation (`Optimizer.add_param_group` is dynamo-disabled, imported then),
so the import moves from the trainer's start to the set-up's `optimizer` lap, beside the
target's load on its thread. The counters below read zero until something imported it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainer.data.samples import Batch
from trainer.model.drafter import DFlashDrafter
from trainer.model.step import attach_mask, drafter_loss, prepare_blocks
from trainer.reporting.runstate import RunState
from trainer.runtime.compile.progress import CompileHistory, compile_signature, watch_compiles
from trainer.runtime.setup import RunSetup
from trainer.targets.load import TargetFeatures


def compiles_on(devices: Iterable[torch.device]) -> bool:
    """Whether a drafter step on these devices compiles anything (CUDA only)."""
    return any(dev.type == "cuda" for dev in devices)


def _dynamo_utils() -> Any:
    """torch._dynamo.utils if something imported dynamo (a compile did), else None: nothing
    compiled, and importing it only to read zeros would cost a CPU run seconds."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo import utils

    return utils


def graphs_compiled() -> int:
    utils = _dynamo_utils()
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])


class _RecompileHandler(logging.Handler):
    def __init__(self, on_reason: Callable[[str], None]) -> None:
        super().__init__(logging.DEBUG)
        self.on_reason = on_reason

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.on_reason(record.getMessage())
        except Exception:  # a reporting failure must never break the compiling thread
            self.handleError(record)


def watch_recompiles(on_reason: Callable[[str], None]) -> None:
    """Pass every recompile's reason (dynamo's "recompiles" log: which function, which
    guard failed) to `on_reason`, from the thread that recompiles. Turned on after warm-up,
    where a recompile is a stall the operator should be able to explain."""
    torch._logging.set_logs(recompiles=True)
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    if not any(isinstance(h, _RecompileHandler) for h in logger.handlers):
        logger.addHandler(_RecompileHandler(on_reason))


def recompile_summary(message: str) -> str:
    """'Recompiling function forward in /x/model.py:120 ... - guard failure' on one line."""
    lines = [ln.strip(" -") for ln in message.splitlines() if ln.strip(" -")]
    head = lines[0] if lines else message
    head = head.replace("Recompiling function ", "")
    reasons = [ln for ln in lines[1:] if not ln.startswith("triggered by")]
    return f"{head}: {'; '.join(reasons[:2])}"[:300]


def compile_cache_counts() -> dict[str, int]:
    """How the on-disk compile caches answered so far: Inductor's FX graph cache and
    AOTAutograd's cache. Misses mean kernels were generated (minutes), hits that they were
    loaded; a bypass means a graph the caches cannot hold (compiled every time)."""
    utils = _dynamo_utils()
    if utils is None:
        return {"cache_hits": 0, "cache_misses": 0, "cache_bypasses": 0}
    ind, aot = utils.counters["inductor"], utils.counters["aot_autograd"]
    return {
        "cache_hits": int(ind["fxgraph_cache_hit"] + aot["autograd_cache_hit"]),
        "cache_misses": int(ind["fxgraph_cache_miss"] + aot["autograd_cache_miss"]),
        "cache_bypasses": int(ind["fxgraph_cache_bypass"] + aot["autograd_cache_bypass"]),
    }


def compile_breakdown(top: int = 6) -> dict[str, float]:
    """The slowest compile stages so far, in seconds summed over graphs (dynamo's own
    timers: tracing, AOTAutograd, Inductor lowering, kernel builds). Nested stages overlap,
    so the figures do not add up to the warm-up time."""
    utils = _dynamo_utils()
    if utils is None:
        return {}
    totals = {k: sum(v) for k, v in utils.compilation_time_metrics.items()}
    slowest = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {k: round(v, 2) for k, v in slowest}


def raise_cache_limits(limit: int) -> None:
    """Let dynamo keep `limit` graphs per function (and 4x over all) before it gives up
    compiling and runs eagerly."""
    import torch._dynamo

    config = torch._dynamo.config
    config.cache_size_limit = max(config.cache_size_limit, limit)
    config.accumulated_cache_size_limit = max(config.accumulated_cache_size_limit, 4 * limit)


def warm_up(run: RunSetup, state: RunState, code_sha256: str = "", extra_s: float = 0.0) -> float:
    """Returns seconds spent. Leaves no gradients and no optimizer state behind. Compile
    progress goes into `state.compile` (trainer/runtime/compile/progress.py). `extra_s`:
    DFLASH_FAULT=slow:compile:S (a cold or invalidated compile cache)."""

    t0 = time.monotonic()
    buckets = run.cfg.data.seq_buckets
    # The first replica on each device that compiles: a CPU step compiles nothing, so has
    # nothing to warm (2.7 s of the demo's start on an idle 2-core host).
    firsts: dict[torch.device, int] = {}
    for r, dev in enumerate(run.drafter_devices):
        if compiles_on([dev]):
            firsts.setdefault(dev, r)
    if firsts:  # per bucket and device (dynamo guards on both), plus the mask builder's
        raise_cache_limits(4 * len(buckets) * len(firsts))
    history = CompileHistory(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    signature = compile_signature(signature_parts(run, code_sha256))
    last = history.last(signature)
    state.compile_expected(
        last["graphs"] if last else None,
        last.get("seconds") if last else None,
        last.get("cache") if last else None,
    )
    time.sleep(extra_s)
    gen = torch.Generator().manual_seed(0)
    doing = ""
    watching = watch_compiles(state, lambda: doing) if firsts else contextlib.nullcontext()
    with watching:
        for dev, r in firsts.items():
            for S in buckets:
                doing = f"bucket {S} on {dev}"
                _warm_one(run, run.replicas.models[r], dev, S, gen)
    run.replicas.zero_grads()
    seconds = time.monotonic() - t0
    counts = compile_cache_counts()
    cache = (
        "warm"
        if counts["cache_misses"] == 0
        else "cold"
        if counts["cache_hits"] == 0
        else "partial"
    )
    history.record(signature, state.compile.done, seconds, cache)
    return seconds


def signature_parts(run: RunSetup, code_sha256: str) -> dict[str, object]:
    """What decides the warm-up's graphs (runtime/compile/progress.compile_signature)."""
    c = run.cfg
    names = [
        torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu" for d in run.drafter_devices
    ]
    return {
        "code": code_sha256,
        "torch": torch.__version__,
        "arch": run.arch.to_dict(),
        "buckets": list(c.data.seq_buckets),
        "batch": c.train.batch_size,
        "anchors": c.train.num_anchors,
        "packing": c.data.packing,
        "backend": run.settings.backend,
        "loss": [run.settings.chunk_blocks, run.settings.impl],
        "compiled": c.train.compile_drafter,
        "dtype": c.target.dtype,
        "devices": [str(d) for d in run.drafter_devices],
        "gpus": names,
    }


def _warm_one(
    run: RunSetup, model: DFlashDrafter, dev: torch.device, S: int, gen: torch.Generator
) -> None:
    """One forward and backward of `model` on bucket `S`, as the threads will run it."""
    from trainer.runtime.pipeline import autocast_for

    B = run.cfg.train.batch_size
    n_feat = len(run.arch.target_layer_ids) * run.arch.hidden_size
    feat_dtype = model.embed_weight.dtype  # the target's dtype on this device
    ids = torch.randint(0, run.arch.vocab_size, (B, S), generator=gen)
    batch = Batch(
        input_ids=ids,
        loss_mask=torch.ones(B, S),
        lengths=torch.full((B,), S, dtype=torch.long),
        index=0,
    )
    if run.cfg.data.packing:  # the packed graph: two documents per row
        half = torch.arange(S) >= S // 2
        batch.doc_ids = half.long().expand(B, S).clone()
        batch.position_ids = (torch.arange(S) - half * (S // 2)).expand(B, S).clone()
    blocks = prepare_blocks(batch, run.cfg.train.num_anchors, 0, 0).to(dev)
    # As the target thread does it: outside autocast, so the same graph serves both.
    attach_mask(blocks, run.settings.backend, run.settings.block_size)
    features = torch.randn(B, S, n_feat, generator=gen).to(dev, feat_dtype)
    with autocast_for(dev):
        out = drafter_loss(model, blocks, features, run.settings)
    out.loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def warm_up_targets(run: RunSetup) -> float:
    """`target.compile`: compile each target's full-attention layers and run one forward
    per bucket on the main thread, as the target threads will (packed or not), before any
    thread starts: a graph compiled later would be a recompile in the target's thread.
    Needs the target's weights in (after `finish_loading`). Returns seconds spent."""
    cfg = run.cfg
    if not cfg.target.compile:
        return 0.0
    t0 = time.monotonic()
    gen = torch.Generator().manual_seed(0)
    B, buckets = cfg.train.batch_size, cfg.data.seq_buckets
    for dev in dict.fromkeys(run.target_devices):
        features = run.targets[dev].features
        if dev.type != "cuda" or not isinstance(features, TargetFeatures):
            continue
        layers = len(features.linear)
        # One entry per layer and bucket where dynamo cannot share a graph between layers,
        # plus the resumed halves around varlen's graph break.
        raise_cache_limits(2 * layers * len(buckets) + 8)
        features.compile_layers()
        for S in buckets:
            ids = torch.randint(0, run.arch.vocab_size, (B, S), generator=gen)
            if cfg.data.packing:  # the packed graph: two documents per row
                half = torch.arange(S) >= S // 2
                pos = (torch.arange(S) - half * (S // 2)).expand(B, S).clone()
                features(ids.to(dev), pos.to(dev), features.packed_docs(pos, dev))
            else:
                features(ids.to(dev))
        torch.cuda.synchronize(dev)
    return time.monotonic() - t0
