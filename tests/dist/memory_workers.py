"""Worker for the memory-estimate check: the bytes of parameters, gradients and optimizer state each rank really
holds at a step's peak (train.observe.memory, which `python -m bench memory_estimate` measures with too), beside the
launch plan's estimate of them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from launcher.compose import compose_and_plan
from tests.dist.workers import _join
from train import distributed
from train.observe.memory import estimated_memory, measure_memory


def measure_states(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    env = _join(rank, world, port)
    results = {}
    try:
        for name, overrides in runs.items():
            cfg, plan = compose_and_plan([f"local.nproc={world}", "logger.backend=none", *overrides])
            assert plan.fit is not None
            measured = measure_memory(cfg, env, torch.device("cpu"), activations=False)
            results[name] = {"measured": measured["states"],
                             "estimated": estimated_memory(plan.fit.estimate)["states"]}
    finally:
        distributed.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
