"""Everything a run needs before its first step: target, tokenizer, data, drafter, optimizer."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.attention import resolve_backend
from trainer.blocks import default_gamma
from trainer.config import Config
from trainer.data import Sample, batches_per_epoch, load_samples, resolve_data_path
from trainer.model import DFlashDrafter, DrafterArch
from trainer.optim import make_optimizer
from trainer.step import LossSettings
from trainer.target import (
    LoadedTarget,
    TargetInfo,
    default_target_layer_ids,
    load_target,
    load_tokenizer,
    read_target_info,
    resolve_dtype,
)
from trainer.tiny_target import resolve_target_path


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device: {name!r} requested but CUDA is not available")
    return dev


def drafter_arch(cfg: Config, info: TargetInfo, layer_ids: list[int], mask_id: int) -> DrafterArch:
    d = cfg.drafter
    return DrafterArch(
        hidden_size=info.hidden_size,
        num_layers=d.num_layers,
        num_heads=d.num_heads or info.num_heads,
        num_kv_heads=d.num_kv_heads or info.num_kv_heads,
        head_dim=d.head_dim or info.head_dim,
        intermediate_size=d.intermediate_size or info.intermediate_size,
        vocab_size=info.vocab_size,
        rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta,
        block_size=d.block_size,
        mask_token_id=mask_id,
        target_layer_ids=tuple(layer_ids),
    )


def loss_settings(cfg: Config, device: torch.device) -> LossSettings:
    t = cfg.train
    return LossSettings(
        backend=resolve_backend(t.attention, device),
        block_size=cfg.drafter.block_size,
        gamma=t.gamma or default_gamma(cfg.drafter.block_size),
        chunk_blocks=t.loss_chunk_blocks,
        topk=t.topk,
        impl=t.loss_impl,
    )


@dataclass
class RunSetup:
    cfg: Config
    device: torch.device
    target_path: Path
    target: LoadedTarget
    tokenizer: Any
    arch: DrafterArch
    drafter: DFlashDrafter
    optimizer: torch.optim.Optimizer
    samples: list[Sample]
    batches_per_epoch: int
    total_steps: int
    settings: LossSettings


def build_run(
    cfg: Config,
    warn: Callable[[str], None],
    phase: Callable[[str], None] = lambda _p: None,
) -> RunSetup:
    """Load and build in the order that fails fastest on bad input."""
    device = resolve_device(cfg.train.device)
    settings = loss_settings(cfg, device)
    data_path = resolve_data_path(cfg.data.path)
    target_path = resolve_target_path(cfg.target.path)
    info = read_target_info(target_path)
    layer_ids = cfg.drafter.target_layer_ids or default_target_layer_ids(
        info.num_layers, cfg.drafter.num_layers
    )
    tokenizer, mask_id = load_tokenizer(target_path, cfg.drafter.mask_token)

    phase("loading_data")
    samples, _report = load_samples(
        data_path, tokenizer, cfg.data.format, max(cfg.data.seq_buckets), warn=warn
    )
    per_epoch = batches_per_epoch(samples, cfg.data.seq_buckets, cfg.train.batch_size)

    phase("loading_target")
    target = load_target(target_path, layer_ids, resolve_dtype(cfg.target.dtype, device), device)
    arch = drafter_arch(cfg, info, layer_ids, mask_id)
    torch.manual_seed(cfg.train.seed)
    drafter = DFlashDrafter(arch, target.embed_weight, target.lm_head_weight).to(device)
    optimizer = make_optimizer(drafter, cfg.train, device)
    total = cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * per_epoch))
    return RunSetup(
        cfg=cfg,
        device=device,
        target_path=target_path,
        target=target,
        tokenizer=tokenizer,
        arch=arch,
        drafter=drafter,
        optimizer=optimizer,
        samples=samples,
        batches_per_epoch=per_epoch,
        total_steps=total,
        settings=settings,
    )
