"""The bare PyTorch loop the loop benchmarks measure ours against (bench/loop_overhead.py on CPU ranks,
bench/loop_overhead_gpu.py and bench/gpu_profile.py on a GPU), and the one-rank process group both arms run in.

The bare loop is what a user would write: the same model class built from the same config (train.model.build), one
fixed micro batch already in memory (no data loading at all), forward, cross-entropy, backward with the same
gradient accumulation, clip_grad_norm_, the same AdamW (train.optim.build_optimizer), zero_grad; timed as ours is,
over intervals of LOG_EVERY steps with the first (warm-up) dropped.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

LOG_EVERY = 10


def init_single_process() -> Any:
    """This process as rank 0 of a world of one (gloo), as `python -m launcher` starts a local rank."""
    from train import distributed

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      SLURMTRAIN_LAUNCHER="local")
    if "MASTER_PORT" not in os.environ:
        from bench.ports import hosted_port

        os.environ["MASTER_PORT"] = str(hosted_port(1))
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    return env


def bare(cfg: Any, steps: int, rank: int = 0, world: int = 1, device: Any = None) -> float:
    """Median wall time per step of a plain PyTorch loop over the same model work (s); with world > 1 the model is
    wrapped in a default DistributedDataParallel and each rank trains on a micro batch of its own. On a GPU
    (`device`): the model there, autocast to the config's compute dtype, its blocks' linear layers in float8 for
    precision=fp8, each block compiled when the config compiles them (strategy.compile), and the clock read after
    a device sync."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from train.data import build_source, load_micro_batch
    from train.loop import seed_everything
    from train.model.blocks import blocks_for
    from train.model.build import build_model, logits_of
    from train.optim import build_optimizer

    device = device or torch.device("cpu")
    t = cfg.trainer
    seed_everything(t.seed)
    model = build_model(cfg.model).to(device)
    if cfg.precision.name == "fp8":  # torchao's float8 linear layers, as ours converts them
        from train.model.float8 import convert

        convert(model, cfg, device)
    if cfg.strategy.get("compile", False):
        for _, block in blocks_for(model, cfg.model, cfg.strategy):
            block.compile()
    optimizer = build_optimizer(model, cfg.optim)
    wrapped = DistributedDataParallel(model) if world > 1 else model
    dtype = getattr(torch, cfg.precision.compute_dtype)
    autocast = (contextlib.nullcontext() if dtype == torch.float32
                else torch.autocast(device_type=device.type, dtype=dtype))
    micro = t.micro_batch_size
    inputs, targets = (x.to(device) for x in load_micro_batch(build_source(cfg.data, cfg.model.vocab_size),
                                                                  range(rank * micro, (rank + 1) * micro)))
    intervals, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        for _ in range(t.grad_accum_steps):
            with autocast:
                logits = logits_of(wrapped(inputs))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            (loss / t.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % LOG_EVERY == 0:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # ours reads the loss at a log step: the same sync
            now = time.perf_counter()
            if step > LOG_EVERY:  # the first interval is warm-up, as for ours
                intervals.append((now - start) / LOG_EVERY)
            start = now
    return statistics.median(intervals)
