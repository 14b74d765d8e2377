"""When no strategy and no micro batch fits: the one change that does, named for what is too large.

Tried in order, each with the run's own strategy and micro batch, and the first that fits is the advice:
    fewer local ranks    a local run splits this host's memory between its ranks (local.nproc=1000: a megabyte each)
    shorter sequences    activations, logits and RoPE's tables grow with data.seq_len and model.max_seq_len
Neither fits: a smaller model or more, larger GPUs (launcher/plan/fit.py says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from launcher.plan.cross_checks import count_parameters
from launcher.plan.estimate import ModelShape

# (trial config, its model's shape, local ranks) -> whether it fits: the caller's estimate against its capacity.
FitsAt = Callable[[DictConfig, ModelShape, int], bool]


def _fewer_ranks(cfg: DictConfig, shape: ModelShape, ranks: int, fits_at: FitsAt) -> str | None:
    parallel = cfg.get("parallel")
    model_parallel = parallel is not None and int(parallel.tp) * int(parallel.pp) * int(parallel.get("cp", 1)) > 1
    if cfg.get("cluster") is not None or ranks <= 1 or model_parallel:
        return None
    if not fits_at(cfg, shape, 1):
        return None
    lo, hi = 1, ranks - 1  # the most ranks that fit: fewer ranks, more memory each
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits_at(cfg, shape, mid) else (lo, mid - 1)
    return f"use local.nproc={lo} or fewer (the {ranks} local ranks share this host's memory, {ranks} ways)"


def _shorter_sequences(cfg: DictConfig, shape: ModelShape, ranks: int, fits_at: FitsAt) -> str | None:
    if shape.config is None:  # a user's model: its activations are not estimated, the sequence does not decide
        return None
    longest = max(int(cfg.data.seq_len), int(cfg.model.max_seq_len))
    follows = OmegaConf.is_interpolation(cfg.data, "seq_len")  # data.seq_len is model.max_seq_len's
    length = 1 << (longest.bit_length() - 1)
    if length == longest:
        length //= 2
    while length >= 1:
        trial = cfg.copy()
        changed = []
        if int(cfg.model.max_seq_len) > length:
            trial.model.max_seq_len = length
            changed.append(f"model.max_seq_len={length}")
        if not follows and int(cfg.data.seq_len) > length:
            trial.data.seq_len = length
            changed.append(f"data.seq_len={length}")
        trial_shape = dataclasses.replace(ModelShape.ours(trial.model, count_parameters(trial.model)),
                                          activation_share=shape.activation_share)
        if fits_at(trial, trial_shape, ranks):
            return (f"use {' '.join(changed)} (or shorter: a sequence of {longest} tokens does not fit even at "
                    f"trainer.micro_batch_size=1)")
        length //= 2
    return None


def smaller_run(cfg: DictConfig, shape: ModelShape, ranks: int, fits_at: FitsAt) -> str | None:
    """The change that makes the run fit, with its words; None when neither fewer ranks nor shorter sequences do."""
    return _fewer_ranks(cfg, shape, ranks, fits_at) or _shorter_sequences(cfg, shape, ranks, fits_at)
