"""AdamW and its learning-rate schedule (optim.schedule, closed forms of the step in train/schedules.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from contract.rules.schedules import Schedule
from contract.rules.schedules import cosine_factor as lr_factor  # noqa: F401 - the default schedule, by its old name


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # No weight decay on norms, biases and other vectors (the usual GPT/Llama recipe).
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def peak_lr(cfg: Any) -> float:
    """The launch plan's learning rate (optim.lr after optim.lr_scaling); optim.lr where no plan derived it."""
    return float(cfg.scaled_lr if cfg.get("scaled_lr") is not None else cfg.lr)


def build_optimizer(model: nn.Module, cfg: Any, fused: bool = True) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel per step, on CPU and GPU alike): it takes the stability verdict as `found_inf` and
    skips a step on the device (train/stability/verdict.py). `fused=False`: foreach kernels (DeepSpeed's wrapper
    steps it itself; fp16's GradScaler skips steps itself)."""
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=peak_lr(cfg),
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **({"fused": True} if fused else {"foreach": True}),
    )


class StepSchedule(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR over a Schedule, whose only state is the step: a resume sets every group's rate to the closed form
    of this run's config at the restored step. (LambdaLR restored its saved base rates and left the optimizer's
    restored rate, the old schedule's, for the first step: an extended run trained one step at the old end's rate
    and jumped at the next.)"""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule) -> None:
        self.schedule = schedule
        super().__init__(optimizer, lambda n: schedule.factor(n))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("schedule")  # the config says it; checkpoints hold plain values only
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes only the step from a saved state (ours, or torch's LambdaLR's in older checkpoints)."""
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        factor = self.schedule.factor(self.last_epoch)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, max_steps: int) -> StepSchedule:
    # The schedule is read from the config once, not at every step (OmegaConf attribute access is slow).
    return StepSchedule(optimizer, Schedule.from_config(cfg, max_steps))
