"""AdamW and the learning-rate schedule: linear warmup, then cosine decay to lr * min_lr_ratio."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for the optimizer step with this 0-based index."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # No weight decay on norms, biases and other vectors (the usual GPT/Llama recipe).
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def peak_lr(cfg: Any) -> float:
    """The launch plan's learning rate (optim.lr after optim.lr_scaling); optim.lr where no plan derived it."""
    return float(cfg.scaled_lr if cfg.get("scaled_lr") is not None else cfg.lr)


def build_optimizer(model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=peak_lr(cfg),
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        # foreach kernels are fine on CPU and GPU; fused is CUDA-only on older torch.
        foreach=True,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    # The values read once, not through the config at every step (OmegaConf attribute access is slow).
    warmup_steps, min_lr_ratio = int(cfg.warmup_steps), float(cfg.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, max_steps, min_lr_ratio)
    )
