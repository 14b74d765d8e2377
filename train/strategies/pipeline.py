"""Pipeline parallelism with torch.distributed.pipelining: this rank's stage and its 1F1B schedule.

A step's accumulation steps are the pipeline's micro batches: the schedule runs all of them through the stages
and scales the gradients by their number, which is what accumulation does without a pipeline. The last stage
computes the loss; every rank returns a value whose mean over the world is the step's loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from train.data import forward_kwargs
from train.loss import cross_entropy
from train.strategies.grads import total_norm


def stage_layers(n_layers: int, stages: int, stage: int) -> range:
    """Consecutive layers, the same number on every stage (the plan refuses layer counts that don't divide)."""
    per = n_layers // stages
    return range(stage * per, (stage + 1) * per)


def rank_stages(pp_rank: int, pp: int, virtual: int) -> list[int]:
    """The stages a pipeline rank runs: one, or `virtual` of them in a loop (rank r: r, r + pp, ...)."""
    return [pp_rank + k * pp for k in range(virtual)]


def rank_layers(n_layers: int, pp: int, virtual: int, pp_rank: int) -> list[int]:
    return [layer for s in rank_stages(pp_rank, pp, virtual) for layer in stage_layers(n_layers, pp * virtual, s)]


class Chunk(nn.Module):
    """One stage of an interleaved schedule: a view of the rank's model that runs only that stage's layers (the
    modules are the model's own, so the optimizer and checkpoints see one model with its usual names)."""

    def __init__(self, model: Any, layers: range) -> None:
        super().__init__()
        self.cfg = model.cfg
        n_layers = int(self.cfg.n_layers)
        self.embed = model.embed if layers.start == 0 else None
        self.pos_embed = model.pos_embed if layers.start == 0 else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[str(i)] for i in layers})
        self.final_norm = model.final_norm if layers.stop == n_layers else None
        self.context = getattr(model, "context", None)  # parallel.cp: this rank's chunks of each sequence
        self.lm_head = model.lm_head if layers.stop == n_layers else None
        if self.cfg.position == "rope":
            self.register_buffer("rope_cos", model.rope_cos, persistent=False)
            self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        from train.model.transformer import Transformer

        return Transformer.forward(self, tokens, document_ids=document_ids)  # type: ignore[arg-type]


def chunks(model: Any, layout: Any, virtual: int) -> list[nn.Module]:
    """The modules the schedule runs on this rank: the model itself (1F1B), or one Chunk per stage."""
    if virtual == 1:
        return [model]
    n_layers, total = int(model.cfg.n_layers), layout.pp * virtual
    return [Chunk(model, stage_layers(n_layers, total, s)) for s in rank_stages(layout.pp_rank, layout.pp, virtual)]


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, layout: Any) -> torch.Tensor:
    """The global gradient norm (over tensor and data-parallel shards, and over every pipeline stage's
    parameters), then every gradient scaled by max_norm / norm when that is below 1."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = total_norm(grads)
    if layout.pp > 1:
        squared = norm.double() ** 2
        dist.all_reduce(squared, group=layout.pp_group)
        norm = squared.sqrt().to(norm.dtype)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        # A tensor-parallel shard is scaled in place through its local tensor: the same multiply, and no read of
        # the coefficient by the host (a DTensor won't take a plain tensor operand). Every gradient is on the
        # rank's one device, where the norm was computed.
        (g.to_local() if isinstance(g, DTensor) else g).mul_(coefficient)
    return norm


def _uncounted_inference(stage: Any) -> None:
    """torch infers a stage's shapes once by running its forward, with gradients (torch 2.13), on empty tensors: a
    MoE layer must not count that routing in its telemetry (step 1's load-balancing loss read nan)."""
    from train.model.moe import MoE

    infer = getattr(stage, "_forward_metadata_inference", None)
    if infer is None:
        return

    def uncounted(*args: Any, **kwargs: Any) -> Any:
        MoE.counting = False
        try:
            return infer(*args, **kwargs)
        finally:
            MoE.counting = True

    stage._forward_metadata_inference = uncounted


class Pipeline:
    def __init__(self, strategy: Any, parts: list[nn.Module]) -> None:
        layout, cfg = strategy.layout, strategy.cfg
        self.strategy = strategy
        self.pp, self.first, self.last = layout.pp, layout.pp_rank == 0, layout.pp_rank == layout.pp - 1
        virtual = len(parts)
        group = layout.pp_group
        stages: list[Any] = [PipelineStage(part, s, layout.pp * virtual, strategy.device, group=group)
                  for part, s in zip(parts, rank_stages(layout.pp_rank, layout.pp, virtual), strict=True)]
        for stage in stages:
            _uncounted_inference(stage)
        n_micro = int(cfg.trainer.grad_accum_steps)
        # parallel.cp: a training micro batch's loss is weighed by the rank's share of the counted targets, as
        # train/step.py weighs it without a pipeline; evaluation sums unweighed means times their own counts.
        self.context, self.weigh = strategy.context, False
        self.schedule = (Schedule1F1B(stages[0], n_microbatches=n_micro, loss_fn=self._loss) if virtual == 1 else
                         ScheduleInterleaved1F1B(stages, n_microbatches=n_micro, loss_fn=self._loss))

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if self.context is not None and self.weigh:
            loss = loss * self.context.target_share(targets.reshape(-1))
        return loss

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """One optimizer step's forward and backward over every micro batch; a loss whose world mean is the
        step's mean loss (the last stage's, times pp; zero elsewhere). `extra`: the batch's document ids."""
        self.weigh = True
        try:
            losses = self._run(self.schedule.step, inputs, targets, extra)
        finally:
            self.weigh = False
        if not self.last:
            return torch.zeros((), device=inputs.device)
        return torch.stack([loss.detach() for loss in losses]).mean() * self.pp

    def forward_only(self, inputs: torch.Tensor, targets: torch.Tensor, *extra: torch.Tensor) -> list[torch.Tensor]:
        """The micro batches through the schedule without backward (its eval): the last stage's loss per micro
        batch (empty elsewhere)."""
        return self._run(self.schedule.eval, inputs, targets, extra)

    def _run(self, call: Any, inputs: torch.Tensor, targets: torch.Tensor,
             extra: tuple[torch.Tensor, ...] = ()) -> list[torch.Tensor]:
        """One pass of the schedule: the first stage feeds the inputs, the last the targets; keyword inputs (the
        document ids) reach every stage, split into micro batches as the inputs are."""
        losses: list[torch.Tensor] = []
        kwargs = forward_kwargs(extra)
        with self.strategy.autocast():
            if self.first:
                call(inputs, target=targets if self.last else None, losses=losses, **kwargs)
            elif self.last:
                call(target=targets, losses=losses, **kwargs)
            else:
                call(**kwargs)
        return losses
