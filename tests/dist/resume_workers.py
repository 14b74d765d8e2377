"""Worker for tests/dist/test_resume_any_world.py: for each run, the uninterrupted run, then the same run stopped by a
preemption signal and resumed from its checkpoint, all in one process group (a spawn per strategy would cost more
than the runs). Each attempt builds its strategy afresh, as a new process would."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from tests.dist.workers import _join, planned
from train import distributed
from train.faults.preemption import TEST_SIGNAL_ENV
from train.loop import train


def _attempt(env: distributed.DistEnv, world: int, run_dir: Path, overrides: list[str], stop_at: str | None) -> None:
    cfg = planned([f"local.nproc={world}", "logger.backend=none", "trainer.log_every=1", *overrides])
    run_dir.mkdir(parents=True, exist_ok=True)
    if stop_at is None:
        os.environ.pop(TEST_SIGNAL_ENV, None)
    else:
        os.environ[TEST_SIGNAL_ENV] = f"{stop_at}:{world - 1}"  # the last rank is signalled: all stop there
    try:
        train(cfg, env, torch.device("cpu"), run_dir)
    finally:
        os.environ.pop(TEST_SIGNAL_ENV, None)


def stop_and_resume(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]], stop_at: int,
                    forgetful: list[str]) -> None:
    """RUN/whole, RUN/split (stopped after `stop_at`, then resumed). For the runs named in `forgetful`, also
    RUN/forgot: resumed from a copy of the stopped checkpoint without the gradient-compression state files."""
    env = _join(rank, world, port)
    try:
        for name, overrides in runs.items():
            root = Path(out_dir) / name
            _attempt(env, world, root / "whole", overrides, None)
            _attempt(env, world, root / "split", overrides, str(stop_at))
            if name in forgetful:
                torch.distributed.barrier()
                if rank == 0:
                    shutil.copytree(root / "split", root / "forgot")
                    for f in (root / "forgot").glob("checkpoints/step_*/gradcomm_rank*.pt"):
                        f.unlink()
                    for f in (root / "forgot").glob("checkpoints/step_*/manifest/*.json"):
                        f.unlink()  # the manifest lists the files: rewritten without them below
                torch.distributed.barrier()
                from train.checkpoints import manifest

                for step_dir in (root / "forgot").glob("checkpoints/step_*"):
                    manifest.write_piece(step_dir, rank)
                torch.distributed.barrier()
                _attempt(env, world, root / "forgot", overrides, None)
            _attempt(env, world, root / "split", overrides, None)
    finally:
        distributed.destroy_process_group()
