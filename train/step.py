"""One optimizer step's work: its micro batches forward and backward with accumulation (or a pipeline's
schedule), and the state that counts the steps and samples trained (TrainState).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.data import (
    TokenSource,
    forward_kwargs,
    load_micro_batch,
    micro_batch_indices,
)
from train.data.index import INDEX_VERSION
from train.data.prefetch import BatchPrefetcher, to_device
from train.distributed import DistEnv
from train.faults.preemption import StopOutcome
from train.loss import TokenCount, losses
from train.model.build import logits_of
from train.model.moe import AuxLoss
from train.observe.telemetry import NO_TIMING, StepTimer
from train.stability import faults
from train.stability.z_loss import ZLoss
from train.strategies.base import Strategy


@dataclass
class TrainState:
    step: int = 0
    # Global sample index of the next sample: the data position, independent of the world size.
    samples: int = 0
    tokens: int = 0
    wandb_id: str | None = None
    # The order of windows within an epoch (train/data/index.py); a checkpoint without it used version 1.
    data_index: int = INDEX_VERSION
    # As of a save: the training loss summed over the steps since the last logged row (averaged over the ranks), and
    # how many; a run resumed between two rows goes on with them, so that its next loss_avg is the whole interval's
    # (train/observe/metrics.py IntervalLoss). A checkpoint without them carried none.
    loss_sum: float = 0.0
    loss_steps: int = 0


@dataclass
class TrainResult:
    state: TrainState
    model: torch.nn.Module
    losses: dict[int, float]
    # exit_code 0: finished or to be requeued; EXIT_STOPPED: checkpointed and stopped, the same command resumes.
    outcome: StopOutcome = StopOutcome(0, None)


# Tests set this to a directory: each rank appends the global sample indices it trains on, one line per step.
TRACE_SAMPLES_ENV = "SLURMTRAIN_TRACE_SAMPLES"


def trace_samples(state: TrainState, env: DistEnv, indices: list[int], strategy: Strategy | None = None) -> None:
    trace_dir = os.environ.get(TRACE_SAMPLES_ENV)
    if strategy is not None and strategy.layout is not None and not strategy.layout.feeds_data:
        return  # a tensor-parallel peer or a later stage of the same replica: the same samples
    if trace_dir:
        with open(Path(trace_dir) / f"rank{env.rank}_world{env.world_size}.txt", "a") as f:
            f.write(f"{state.step + 1} {' '.join(map(str, indices))}\n")


def _no_mark() -> None:
    pass


@dataclass(frozen=True)
class StepSettings:
    """The config values a step reads, as plain values: the loop makes them once (an OmegaConf read costs tens of
    microseconds, and a tiny model's CPU step is a few milliseconds)."""
    accum: int
    micro_batch_size: int
    documents: bool  # data.document_mask: batches carry document ids
    compiled: bool  # strategy.compile: the loss's chunk arithmetic through torch.compile

    @classmethod
    def of(cls, cfg: Any) -> StepSettings:
        t = cfg.trainer
        return cls(int(t.grad_accum_steps), int(t.micro_batch_size), bool(cfg.data.get("document_mask", False)),
                   bool(cfg.strategy.get("compile", False)))


def train_step(model: torch.nn.Module, strategy: Strategy, source: TokenSource, state: TrainState, cfg: Any,
               env: DistEnv, device: torch.device, timer: StepTimer = NO_TIMING,
               mark: Callable[[], None] = _no_mark, prefetcher: BatchPrefetcher | None = None,
               z_loss: ZLoss | None = None, tokens: TokenCount | None = None,
               settings: StepSettings | None = None) -> torch.Tensor:
    """One optimizer step over `accum` micro batches; returns this rank's mean loss (a tensor, no sync). `mark`
    counts progress inside the step (the watchdog's: a hung rank is the one that got least far). With a
    `prefetcher` the micro batches come ready from its thread; without one they are loaded here. `z_loss`
    (optim.z_loss): added to what is backpropagated; the returned loss is the cross-entropy alone. `tokens` counts
    the targets that count (supervised fine-tuning data's response tokens). `settings`: StepSettings.of(cfg),
    made here when not given."""
    if strategy.pipeline is not None:
        return pipeline_step(strategy, source, state, cfg, env, device, timer, mark, tokens)
    s = settings or StepSettings.of(cfg)
    accum, micro_batch_size, documents = s.accum, s.micro_batch_size, s.documents
    fused, compiled = strategy.fused_loss, s.compiled
    z_coef = z_loss.coefficient if z_loss is not None else 0.0
    AuxLoss.scale = 1.0 / accum  # a MoE layer's auxiliary losses, averaged over the micro batches as the loss is
    # Sums over the micro batches (None before the first: no zeros to add to, and no division with one micro batch).
    loss_sum: torch.Tensor | None = None
    z_sum: torch.Tensor | None = None
    consumed: list[int] = []
    for micro in range(accum):
        idx = micro_batch_indices(state.samples, micro, strategy.dp_rank, strategy.dp_size, micro_batch_size)
        consumed.extend(idx)
        with timer.data():
            if prefetcher is not None:
                inputs, targets, *extra = prefetcher.get(idx)
            else:
                inputs, targets, *extra = to_device(load_micro_batch(source, idx, documents), device)
        if faults.active():
            inputs, targets = faults.batch(inputs, targets, state.step + 1, state.samples)
        inputs, targets = strategy.split_sequence(inputs, targets)  # parallel.cp: this rank's chunks
        if tokens is not None:
            tokens.add(targets)
        mark()
        with strategy.accumulation(micro == accum - 1), timer.synchronised(micro == accum - 1):
            flat_targets = targets.reshape(-1)
            with strategy.autocast():
                if fused:  # the output layer and the loss together: no logits (train/model/fused_head.py)
                    total, loss, z = model(inputs, targets=targets, **forward_kwargs(extra))
                else:
                    logits = logits_of(model(inputs, **forward_kwargs(extra)))
            if not fused:  # upcast inside, in chunks for a large vocabulary (train/loss.py)
                total, loss, z = losses(logits.reshape(-1, logits.shape[-1]), flat_targets, z_coef, compiled)
            if z is not None:
                z_sum = z.detach() if z_sum is None else z_sum + z.detach()
            if strategy.context is not None:  # parallel.cp: the mean over the whole sequence's counted targets
                share = strategy.context.target_share(flat_targets)
                loss, total = loss * share, total * share
            if faults.active():
                total = faults.loss(total, state.step + 1, state.samples, env.rank)
            mark()
            strategy.backward(total / accum)
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    trace_samples(state, env, consumed, strategy)
    assert loss_sum is not None  # accum >= 1 (the schema's bound)
    if z_loss is not None:
        z_loss.last = mean_of(z_sum if z_sum is not None else torch.zeros((), device=device), accum)
    return mean_of(loss_sum, accum)


def mean_of(total: torch.Tensor, accum: int) -> torch.Tensor:
    """A sum over the micro batches as their mean (with one micro batch the sum itself: x / 1 is x)."""
    return total / accum if accum > 1 else total


def pipeline_step(strategy: Strategy, source: TokenSource, state: TrainState, cfg: Any, env: DistEnv,
                  device: torch.device, timer: StepTimer, mark: Callable[[], None],
                  tokens: TokenCount | None = None) -> torch.Tensor:
    """A pipeline stage's step: the step's micro batches, in order, go through the schedule together."""
    t = cfg.trainer
    consumed: list[int] = []
    with timer.data():
        for micro in range(t.grad_accum_steps):
            consumed.extend(micro_batch_indices(state.samples, micro, strategy.dp_rank, strategy.dp_size,
                                                t.micro_batch_size))
        batch = to_device(load_micro_batch(source, consumed, bool(cfg.data.get("document_mask", False))), device)
    batch = (*strategy.split_sequence(batch[0], batch[1]), *batch[2:])  # parallel.cp: this rank's chunks
    if tokens is not None:
        tokens.add(batch[1])
    mark()
    AuxLoss.scale = 1.0  # the schedule divides every gradient by its micro batches (scale_grads)
    with timer.synchronised(True):
        loss = strategy.pipeline.step(*batch)
    trace_samples(state, env, consumed, strategy)
    return loss
