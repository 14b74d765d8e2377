"""Worker for the memory-estimate check: the bytes of parameters, gradients and optimizer state each rank really
holds after a step, counted as the sum of the unique tensor storages reachable from the model and optimizer."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import torch

from launcher.compose import compose_and_plan
from tests.dist.workers import _join


def _storages(obj: Any, seen_objects: set[int], found: dict[int, int], depth: int = 0) -> None:
    if depth > 6 or id(obj) in seen_objects:
        return
    seen_objects.add(id(obj))
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        if local.is_floating_point() and local.numel() > 1:
            storage = local.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
        for attr in ("grad", "ds_tensor"):
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
    elif isinstance(obj, torch.nn.Module):
        for p in obj.parameters():
            _storages(p, seen_objects, found, depth + 1)
    elif isinstance(obj, torch.optim.Optimizer) or type(obj).__module__.startswith("deepspeed"):
        _storages(vars(obj), seen_objects, found, depth + 1)


def held_bytes(strategy: Any) -> int:
    found: dict[int, int] = {}
    seen: set[int] = set()
    for p in strategy.model.parameters():
        _storages(p, seen, found)
    _storages(strategy.optimizer, seen, found)
    return sum(found.values())


def measure_states(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    from train import distributed
    from train.data import build_source
    from train.loop import TrainState, seed_everything, train_step
    from train.model import build_model
    from train.strategies import build_strategy

    env = _join(rank, world, port)
    device = torch.device("cpu")
    results = {}
    try:
        for name, overrides in runs.items():
            cfg, plan = compose_and_plan([f"local.nproc={world}", "logger.backend=none", *overrides])
            seed_everything(0)
            strategy = build_strategy(cfg, env, device)
            model = strategy.setup(build_model(cfg.model))
            source = build_source(cfg.data, cfg.model.vocab_size)
            state = TrainState()
            for _ in range(2):
                train_step(model, strategy, source, state, cfg, env, device)
                strategy.optimizer_step()
                state.samples += cfg.trainer.global_batch_size
            # The next step's backward: measure when its gradients are all held. ZeRO-1 holds them whole until
            # it partitions them at the end of backward (reduce_gradients); measure there too.
            peaks: list[int] = []
            optimizer = getattr(getattr(strategy, "engine", None), "optimizer", None)
            reduce = getattr(optimizer, "reduce_gradients", None)
            if reduce is not None:
                def measured_reduce(*args: Any, **kwargs: Any) -> Any:
                    peaks.append(held_bytes(strategy))
                    return reduce(*args, **kwargs)

                optimizer.reduce_gradients = measured_reduce
            train_step(model, strategy, source, state, cfg, env, device)
            measured = max([held_bytes(strategy), *peaks])
            assert plan.fit is not None
            est = plan.fit.estimate
            results[name] = {"measured": measured, "estimated": est.params + est.grads + est.optimizer}
            del strategy, model
            gc.collect()
    finally:
        distributed.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
