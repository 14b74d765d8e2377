"""Pipeline parallelism with torch.distributed.pipelining: this rank's stage and its 1F1B schedule.

A step's accumulation steps are the pipeline's micro batches: the schedule runs all of them through the stages
and scales the gradients by their number, which is what accumulation does without a pipeline. The last stage
computes the loss; every rank returns a value whose mean over the world is the step's loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor

from train.data import IGNORE_INDEX


def stage_layers(n_layers: int, pp: int, stage: int) -> range:
    """Consecutive layers, the same number on every stage (the plan refuses layer counts that don't divide)."""
    per = n_layers // pp
    return range(stage * per, (stage + 1) * per)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, layout: Any) -> float:
    """The global gradient norm (over tensor and data-parallel shards, and over every pipeline stage's
    parameters), then every gradient scaled by max_norm / norm when that is below 1."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if layout.pp > 1:
        squared = norm.double() ** 2
        dist.all_reduce(squared, group=layout.mesh["pp"].get_group())
        norm = squared.sqrt().to(norm.dtype)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient.item() if isinstance(g, DTensor) else coefficient.to(g.device))
    return float(norm)


class Pipeline:
    def __init__(self, strategy: Any, model: nn.Module) -> None:
        layout, cfg = strategy.layout, strategy.cfg
        self.strategy = strategy
        self.pp, self.first, self.last = layout.pp, layout.pp_rank == 0, layout.pp_rank == layout.pp - 1
        self.stage = PipelineStage(model, layout.pp_rank, layout.pp, strategy.device,
                                   group=layout.mesh["pp"].get_group())
        self.schedule = Schedule1F1B(self.stage, n_microbatches=int(cfg.trainer.grad_accum_steps),
                                     loss_fn=self._loss)

    @staticmethod
    def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step's forward and backward over every micro batch; a loss whose world mean is the
        step's mean loss (the last stage's, times pp; zero elsewhere)."""
        losses: list[torch.Tensor] = []
        with self.strategy.autocast():
            if self.first:
                self.schedule.step(inputs, target=targets if self.last else None, losses=losses)
            elif self.last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
        if not self.last:
            return torch.zeros((), device=inputs.device)
        return torch.stack([loss.detach() for loss in losses]).mean() * self.pp
