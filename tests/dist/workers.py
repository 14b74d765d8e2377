"""Worker functions for torch.multiprocessing in dist tests: the real training loop on a gloo group."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from launcher.compose import compose_and_plan
from train import distributed
from train.loop import train


def train_and_dump_params(rank: int, world: int, port: int, out_dir: str, overrides: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local")
    torch.set_num_threads(1)
    cfg, _ = compose_and_plan([f"local.nproc={world}", "logger.backend=none", *overrides])
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    try:
        result = train(cfg, env, torch.device("cpu"), Path(out_dir))
        flat = torch.cat([p.detach().flatten() for p in result.model.parameters()])
        torch.save({"params": flat, "losses": result.losses}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.destroy_process_group()
