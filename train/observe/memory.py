"""What a rank really holds, measured, to check the launch plan's memory estimate (launcher/plan/estimate.py) against:
the bytes of parameters, gradients and optimizer state at a step's peak, and the bytes autograd saves for backward.

Counted from the tensors themselves, not from an allocator, so the figures mean the same on CPU (gloo) as on a
GPU and compare term by term with the estimate's parameters + gradients + optimizer and its activations. Used by
`python -m bench memory_estimate` and by the tests that hold the estimate to these figures
(tests/dist/test_memory_estimate.py, tests/unit/test_estimate.py).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from train.data import build_source
from train.distributed import DistEnv
from train.loop import seed_everything
from train.model.transformer import build_model
from train.step import TrainState, train_step
from train.strategies import build_strategy


def _storages(obj: Any, seen_objects: set[int], found: dict[int, int], depth: int = 0) -> None:
    if depth > 6 or id(obj) in seen_objects:
        return
    seen_objects.add(id(obj))
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        if local.is_floating_point() and local.numel() > 1:
            storage = local.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
        for attr in ("grad", "ds_tensor"):  # DeepSpeed ZeRO-3 keeps this rank's partition in ds_tensor
            inner = getattr(obj, attr, None)
            if inner is not None:
                _storages(inner, seen_objects, found, depth + 1)
        return
    if isinstance(obj, dict):
        for value in obj.values():
            _storages(value, seen_objects, found, depth + 1)
    elif isinstance(obj, list | tuple | set):
        for value in obj:
            _storages(value, seen_objects, found, depth + 1)
    elif isinstance(obj, nn.Module):
        for p in obj.parameters():
            _storages(p, seen_objects, found, depth + 1)
    elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__.startswith("deepspeed"):
        _storages(vars(obj), seen_objects, found, depth + 1)


def held_state_bytes(strategy: Any) -> int:
    """Bytes of the unique tensor storages reachable from the strategy's model and optimizer (parameters, their
    gradients, optimizer state, DeepSpeed's partitions and master weights): what this rank holds right now."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    for p in strategy.model.parameters():
        _storages(p, seen, found)
    _storages(strategy.optimizer, seen, found)
    return sum(found.values())


def saved_tensor_bytes(forward: Callable[[], Any], owned_by: nn.Module | None = None) -> int:
    """Bytes autograd saves for backward while `forward()` runs: the unique storages packed by
    saved_tensors_hooks, less those of `owned_by`'s parameters and buffers. Tensors saved inside activation
    checkpointed blocks are packed by the checkpoint's own hooks and so are not counted: they are not kept."""
    # Storages are told apart by their StorageImpl, not their address: FSDP frees a gathered block's memory while
    # the tensors saved from it live on, and the next block's gather may reuse the address.
    owned = set() if owned_by is None else {t.untyped_storage()._cdata
                                            for t in [*owned_by.parameters(), *owned_by.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in owned:
            saved[storage._cdata] = storage.nbytes()  # the bytes when saved: FSDP may free them later
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(saved.values())


def with_micro_batch(cfg: Any, micro_batch_size: int) -> Any:
    """A copy of `cfg` whose steps are one micro batch of `micro_batch_size` samples."""
    out = copy.deepcopy(cfg)
    out.trainer.micro_batch_size = micro_batch_size
    out.trainer.grad_accum_steps = 1
    return out


def _train_steps(strategy: Any, model: nn.Module, source: Any, state: Any, cfg: Any, env: DistEnv,
                 device: torch.device, steps: int) -> None:
    for _ in range(steps):
        train_step(model, strategy, source, state, cfg, env, device)
        strategy.optimizer_step()
        state.samples += cfg.trainer.global_batch_size


def peak_state_bytes(strategy: Any, model: nn.Module, source: Any, state: Any, cfg: Any, env: DistEnv,
                     device: torch.device, warmup_steps: int = 1) -> int:
    """Parameters, gradients and optimizer state held at the peak of a step of the real loop: after
    `warmup_steps` steps (then every optimizer's state exists: DeepSpeed creates its at the first step), at the end
    of the next step's backward, when its gradients are all held. ZeRO-1 holds them whole until it partitions them at the end of backward (reduce_gradients): it
    is measured there too. Leaves that step's gradients in place (no optimizer step)."""
    _train_steps(strategy, model, source, state, cfg, env, device, warmup_steps)
    peaks: list[int] = []
    optimizer = getattr(getattr(strategy, "engine", None), "optimizer", None)
    reduce = getattr(optimizer, "reduce_gradients", None)
    if reduce is not None:
        def measured_reduce(*args: Any, **kwargs: Any) -> Any:
            peaks.append(held_state_bytes(strategy))
            return reduce(*args, **kwargs)

        optimizer.reduce_gradients = measured_reduce
    try:
        train_step(model, strategy, source, state, cfg, env, device)
    finally:
        if reduce is not None:
            optimizer.reduce_gradients = reduce
    return max([held_state_bytes(strategy), *peaks])


def activation_bytes(strategy: Any, model: nn.Module, source: Any, state: Any, cfg: Any, env: DistEnv,
                     device: torch.device) -> int:
    """Bytes autograd saves for one micro batch of `cfg` in a step of the real loop (train.loop.train_step,
    forward and loss as the loop computes them), counted as the difference between a step of two micro batches'
    samples and a step of one. What does not grow with the batch drops out: the weights, and the copies of them a
    step makes (autocast's low-precision weights, FSDP's gathered blocks), which the estimate counts as temporary
    buffers, not activations. The hooks span the whole step; its backward packs nothing (a checkpointed block's
    recomputation is packed by the checkpoint's own hooks). `cfg` must have one micro batch per step for DeepSpeed,
    whose accumulation is fixed when its engine is built."""
    micro = int(cfg.trainer.micro_batch_size)
    saved = []
    for samples in (micro, 2 * micro):
        step_cfg = with_micro_batch(cfg, samples)
        saved.append(saved_tensor_bytes(lambda c=step_cfg: train_step(model, strategy, source, state, c, env,
                                                                       device)))
        strategy.optimizer_step()
        state.samples += samples * strategy.dp_size
    return saved[1] - saved[0]


def measure_memory(cfg: Any, env: DistEnv, device: torch.device, states: bool = True,
                   activations: bool = True) -> dict[str, int]:
    """This rank's measured memory for `cfg`, trained with its strategy on a fresh model: `states` (parameters,
    gradients and optimizer state at a step's peak, `peak_state_bytes`) and `activations` (per micro batch,
    `activation_bytes`), the ones asked for. Several configs measured in one process are measured as if each had
    its own: DeepSpeed's ZeRO-3 replaces torch.nn.functional.linear for the whole process ("this will persist
    unless manually reset"), and its linear saves other tensors for backward, so it is put back afterwards."""
    linear = F.linear
    seed_everything(0)
    try:
        strategy = build_strategy(cfg, env, device)
        model = strategy.setup(build_model(cfg.model))
        source = build_source(cfg.data, cfg.model.vocab_size)
        state = TrainState()
        out: dict[str, int] = {}
        if states:
            out["states"] = peak_state_bytes(strategy, model, source, state, cfg, env, device)
        if activations:
            if states:  # finish the step measured for the states
                strategy.optimizer_step()
                state.samples += cfg.trainer.global_batch_size
            out["activations"] = activation_bytes(strategy, model, source, state, cfg, env, device)
        del strategy, model
    finally:
        F.linear = linear
        gc.collect()
    return out


def estimated_memory(estimate: Any) -> dict[str, float]:
    """The terms of a launch plan's MemoryEstimate (launcher/plan/estimate.py) that `measure_memory` measures."""
    return {"states": estimate.params + estimate.grads + estimate.optimizer, "activations": estimate.activations}

