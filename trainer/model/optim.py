"""AdamW over the drafter's trainable parameters, with warmup and a cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.config import TrainConfig


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    # Norm weights are not decayed: shrinking a gain toward 0 is not regularisation.
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    beta1, beta2 = cfg.betas
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(beta1, beta2), fused=device.type == "cuda")


def lr_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cosine down to cfg.lr * cfg.min_lr_ratio at total_steps."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def noise_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Feature-noise std, linear from noise_start to noise_end over the run."""
    t = min(1.0, step / max(1, total_steps))
    return cfg.noise_start + (cfg.noise_end - cfg.noise_start) * t


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
