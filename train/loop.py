"""The training loop: micro steps with accumulation, one optimizer step, logging."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from train.data import build_source, load_micro_batch, micro_batch_indices
from train.distributed import DistEnv, all_reduce_mean
from train.metrics import MetricsLogger, log
from train.model import build_model
from train.strategies import build_strategy


@dataclass
class TrainResult:
    state: TrainState
    model: torch.nn.Module
    losses: dict[int, float]


@dataclass
class TrainState:
    step: int = 0
    # Global sample index of the next sample: the data position, independent of the world size.
    samples: int = 0
    tokens: int = 0
    wandb_id: str | None = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(cfg: Any, env: DistEnv, device: torch.device, run_dir: Path) -> TrainResult:
    t = cfg.trainer
    # Same seed on every rank for the initial weights; DDP also broadcasts them, FSDP needs them equal.
    seed_everything(t.seed)
    model = build_model(cfg.model)
    strategy = build_strategy(cfg, env, device)
    model = strategy.setup(model)
    # Per-rank stream for anything random after init (dropout).
    seed_everything(t.seed + 1000 * env.rank)

    source = build_source(cfg.data, cfg.model.vocab_size)
    accum = t.grad_accum_steps
    dp_size, dp_rank = env.world_size, env.rank
    global_batch = t.micro_batch_size * accum * dp_size
    seq_len = cfg.data.seq_len
    state = TrainState()
    losses: dict[int, float] = {}

    if env.is_main:
        log.info(
            "effective batch %d sequences (micro %d x accumulation %d x data-parallel %d) = %d tokens/step; "
            "strategy %s, precision %s, device %s",
            global_batch, t.micro_batch_size, accum, dp_size, global_batch * seq_len,
            strategy.name, cfg.precision.name, device,
        )
    metrics = MetricsLogger(cfg, env, run_dir, t.max_steps)
    metrics.start(state.step, state.tokens, state.wandb_id, _plain(cfg))
    state.wandb_id = metrics.wandb_id
    try:
        while state.step < t.max_steps:
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                idx = micro_batch_indices(state.samples, micro, dp_rank, dp_size, t.micro_batch_size)
                inputs, targets = (x.to(device, non_blocking=True) for x in load_micro_batch(source, idx))
                with strategy.accumulation(micro == accum - 1):
                    with strategy.autocast():
                        logits = model(inputs)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
                    strategy.backward(loss / accum)
                loss_sum += loss.detach()
            lr = strategy.current_lr()
            grad_norm = strategy.optimizer_step()
            state.step += 1
            state.samples += global_batch
            state.tokens += global_batch * seq_len
            if state.step % t.log_every == 0 or state.step in (1, t.max_steps):
                loss_value = float(all_reduce_mean(loss_sum / accum))
                losses[state.step] = loss_value
                metrics.log(state.step, state.tokens, loss=loss_value, lr=lr, grad_norm=grad_norm)
                metrics.tick(state.step, loss_value)
            else:
                metrics.tick(state.step, None)
    finally:
        metrics.close()
    if env.is_main:
        log.info("finished at step %d (%d tokens)", state.step, state.tokens)
    return TrainResult(state, model, losses)


def _plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


__all__ = ["TrainResult", "TrainState", "train", "asdict"]
