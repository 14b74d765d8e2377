"""checkpoint.verify_early (contract/rules/verify_early.py): after step 1 of a run's first attempt, write the model's
and optimizer's state as a checkpoint to RUN_DIR/checkpoints/.verify_early (the filesystem real checkpoints go to),
read it back into a scratch copy of that state, compare every tensor bit for bit on every rank, and delete it.

What fails stops the run with one line naming it: the write or the read (a broken or full filesystem, a permission),
or a value that does not round-trip (the tensor's name).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

from contract.errors import ConfigError
from contract.rules.verify_early import SCRATCH
from contract.rundir import ckpt_layout as layout
from contract.rundir import env_faults
from train.checkpoints.state import ModelOptimState
from train.observe.metrics import log


class EarlyCheckFailed(ConfigError):
    """The early checkpoint check failed; the message is the one line the user sees (train/entry.py: `error:`, exit
    2, never retried: a requeue would meet the same filesystem)."""


def _scratch_copy(value: Any) -> Any:
    """The same structure with fresh tensors, filled so that one the load does not reach can't pass for equal."""
    if isinstance(value, dict):
        return {k: _scratch_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scratch_copy(v) for v in value]
    if isinstance(value, torch.Tensor):
        fresh = torch.empty_like(value)
        fresh.fill_(float("nan") if value.is_floating_point() else -1)
        return fresh
    return value


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return _local(t).detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def first_difference(live: Any, read: Any, name: str = "") -> str | None:
    """The name of the first value of `live` that `read` does not hold bit for bit, or None."""
    if isinstance(live, dict):
        for key, value in live.items():
            if key not in read:
                return f"{name}{key} (missing)"
            found = first_difference(value, read[key], f"{name}{key}.")
            if found:
                return found
        return None
    if isinstance(live, list):
        return next((f for i, v in enumerate(live) if (f := first_difference(v, read[i], f"{name}{i}."))), None)
    if isinstance(live, torch.Tensor):
        same = isinstance(read, torch.Tensor) and _local(live).shape == _local(read).shape and torch.equal(
            _bits(live), _bits(read))
        return None if same else name.rstrip(".")
    return None  # the optimizer's group settings: this run's config's on load, not read back


def verify_round_trip(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, run_dir: Path,
                      is_main: bool, group: Any = None) -> float:
    """Write, read back and compare the state (every rank), then delete it; the seconds it took. Raises
    EarlyCheckFailed with the one line to show."""
    assert model is not None and optimizer is not None, "the strategy is set up before the first step"
    started = time.perf_counter()
    scratch = layout.checkpoints_root(Path(run_dir)) / SCRATCH
    problem: str | None = None
    if is_main:
        try:
            if scratch.exists():
                shutil.rmtree(scratch)
            scratch.mkdir(parents=True)
            env_faults.disk_full("verify_early", 1, scratch)  # tests only: a full filesystem on demand
        except OSError as err:
            problem = _filesystem(scratch, err)
    if not _any(problem is not None, group):  # every rank takes the same collectives, whatever rank 0 met
        try:
            live = ModelOptimState(model, optimizer).state_dict()
            # The group settings are this run's config's on any load (state.py), never read back: left out.
            expected = {"model": live["model"],
                        "optim": {k: v for k, v in live["optim"].items() if k != "param_groups"}}
            dcp.save({"app": ModelOptimState(model, optimizer)}, checkpoint_id=scratch, process_group=group)
            read = {"app": _scratch_copy(expected)}
            dcp.load(read, checkpoint_id=scratch, process_group=group)
            differs = first_difference(expected, read["app"])
            if differs:
                problem = (f"the checkpoint written after step 1 did not read back bit for bit ({differs} differs): "
                           "the state does not round-trip; resuming from this run's checkpoints would not continue it")
        except (OSError, CheckpointException) as err:  # DCP raises one CheckpointException on every rank
            problem = _filesystem(scratch, err)
    failed = _any(problem is not None, group)
    _barrier(group)
    if is_main:
        shutil.rmtree(scratch, ignore_errors=True)
    if failed:
        raise EarlyCheckFailed(f"checkpoint.verify_early: {problem or 'another rank failed the check (its log says why)'}"
                               "; the run stops now rather than at its first save (checkpoint.verify_early=false "
                               "skips the check)")
    seconds = time.perf_counter() - started
    if is_main:
        log.info("checkpoint check: written after step 1, read back bit for bit and deleted in %.1f s "
                 "(checkpoint.verify_early)", seconds)
    return seconds


def _filesystem(scratch: Path, err: BaseException) -> str:
    what = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return (f"writing or reading a checkpoint in {scratch.parent} failed ({type(err).__name__}: {what[:200]}): fix the "
            "filesystem (space, quota, permissions) or point run.root at one that works")


def _barrier(group: Any) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def _any(flag: bool, group: Any) -> bool:
    if not dist.is_initialized():
        return flag
    value = torch.tensor([1 if flag else 0])
    dist.all_reduce(value, group=group)  # a gloo group (the checkpoint manager's): a CPU tensor
    return bool(value.item())
