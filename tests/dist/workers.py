"""Worker functions for torch.multiprocessing in dist tests: the real training loop on a gloo group."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from launcher.compose import compose_and_plan
from train import distributed
from train.loop import train

_PLANNED: dict[tuple[str, ...], DictConfig] = {}


def planned(overrides: list[str]) -> DictConfig:
    """compose_and_plan's config of these overrides, composed by rank 0 and sent to the others, once per process for
    the same overrides (a compose costs about 0.3 CPU seconds: once a run, not once a rank and attempt, on the 2
    cores the suite shares); a fresh copy each call, as a new compose would give."""
    key = tuple(overrides)
    if key not in _PLANNED:
        if dist.is_initialized() and dist.get_world_size() > 1:
            box = [compose_and_plan(overrides)[0] if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(box, src=0)
            _PLANNED[key] = box[0]
        else:
            _PLANNED[key] = compose_and_plan(overrides)[0]
    return copy.deepcopy(_PLANNED[key])


def _join(rank: int, world: int, port: int) -> distributed.DistEnv:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local",
                      TORCHELASTIC_USE_AGENT_STORE="True")  # the test process hosts the store (tests/dist/store.py)
    torch.set_num_threads(1)
    env = distributed.detect()
    distributed.init_process_group(env, "gloo")
    return env


def train_and_dump_params(rank: int, world: int, port: int, out_dir: str, overrides: list[str]) -> None:
    env = _join(rank, world, port)
    cfg = planned([f"local.nproc={world}", "logger.backend=none", *overrides])
    try:
        result = train(cfg, env, torch.device("cpu"), Path(out_dir))
        flat = torch.cat([p.detach().flatten() for p in result.model.parameters()])
        torch.save({"params": flat, "losses": result.losses}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.destroy_process_group()


def train_several(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    """Several short runs in one process group (one spawn per strategy keeps the tier fast)."""
    env = _join(rank, world, port)
    try:
        for name, overrides in runs.items():
            cfg = planned([f"local.nproc={world}", "logger.backend=none", "trainer.log_every=1", *overrides])
            run_dir = Path(out_dir) / name
            run_dir.mkdir(parents=True, exist_ok=True)
            result = train(cfg, env, torch.device("cpu"), run_dir)
            torch.save(result.losses, run_dir / f"losses_rank{rank}.pt")
    finally:
        distributed.destroy_process_group()


def train_and_dump_full_model(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    """Train each run, then keep what an export must reproduce: the full weights (gathered from the shards) and
    the trained model's logits on fixed tokens (computed by the wrapped model itself)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from train.model.build import logits_of

    env = _join(rank, world, port)
    try:
        for name, overrides in runs.items():
            cfg = planned([f"local.nproc={world}", "logger.backend=none", "trainer.log_every=1", f"run.root={out_dir}",
                           f"run.name={name}", *overrides])
            run_dir = Path(out_dir) / name
            run_dir.mkdir(parents=True, exist_ok=True)
            result = train(cfg, env, torch.device("cpu"), run_dir)
            if int(cfg.parallel.pp) > 1 or cfg.strategy.backend == "deepspeed":
                # A stage holds part of the model, an engine its own state dict: the final checkpoint has the whole
                # (train/weights/export.py load_model_state reads it on one process).
                if rank == 0:
                    torch.save({"losses": result.losses}, run_dir / "reference.pt")
                continue
            full = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True,
                                                                               cpu_offload=True))
            tokens = torch.arange(2 * 16).reshape(2, 16) % cfg.model.vocab_size
            with torch.no_grad():
                logits = logits_of(result.model(tokens))
            if rank == 0:
                torch.save({"losses": result.losses, "state": full, "tokens": tokens, "logits": logits},
                           run_dir / "reference.pt")
    finally:
        distributed.destroy_process_group()
