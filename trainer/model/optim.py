"""AdamW over the drafter's trainable parameters, with warmup and a cosine decay."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

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


def schedule_span(step: int, total_steps: int, cfg: TrainConfig) -> tuple[int, int]:
    """(the step within the schedule, the schedule's length): the schedule starts at
    cfg.schedule_start and runs cfg.schedule_steps (0: to total_steps); past its end the
    values hold (a continued run that keeps its parent's schedule)."""
    length = cfg.schedule_steps or max(1, total_steps - cfg.schedule_start)
    return max(0, step - cfg.schedule_start), length


def lr_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then cosine down to cfg.lr * cfg.min_lr_ratio at the
    schedule's end (total_steps unless cfg.schedule_* say otherwise), held after it."""
    step, total_steps = schedule_span(step, total_steps, cfg)
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def noise_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Feature-noise std, linear from noise_start to noise_end over the schedule."""
    step, total_steps = schedule_span(step, total_steps, cfg)
    t = min(1.0, step / max(1, total_steps))
    return cfg.noise_start + (cfg.noise_end - cfg.noise_start) * t


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_in_step(
    optimizer: torch.optim.Optimizer, params: Sequence[Tensor], max_norm: float
) -> Tensor | None:
    """Clip the gradients' total norm to `max_norm` for the next `optimizer.step()`; return
    the norm before clipping (a 0-d device tensor: never read here, no sync).

    A fused AdamW clips as it reads each gradient: it divides by `grad_scale` (the hook
    torch's GradScaler uses), here 1 / the clip coefficient, so the gradients are not
    scaled in place first: one read and one write of every gradient fewer than
    `clip_grad_norm_` (bench/gpu_bench.py's optimizer section). Any other optimizer gets
    `clip_grad_norm_` itself."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    if optimizer.defaults.get("fused"):
        norm = torch.nn.utils.get_total_norm(grads)
        # clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6), at most 1.
        optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)  # type: ignore[attr-defined]
        return norm
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
