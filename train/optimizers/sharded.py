"""What the optimizers here share: a parameter's local shard, and the stability verdict's skip flag.

FSDP and tensor parallelism hold parameters, gradients and state as DTensors: an elementwise update runs on the
local shards, and only what needs the whole matrix (Muon's orthogonalisation) gathers it. The verdict
(train/stability/verdict.py) sets `optimizer.found_inf`, a float tensor, 1.0 where the step must not be applied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (all of it unless sharded); in-place changes reach `t`."""
    return t.to_local() if isinstance(t, DTensor) else t


def whole(t: torch.Tensor) -> torch.Tensor:
    """A value every rank needs whole (a norm of a DTensor is partial until reduced)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def found_inf(optimizer: Any) -> torch.Tensor | None:
    return getattr(optimizer, "found_inf", None)


def skipped_on_host(optimizer: Any) -> bool:
    """Whether the verdict skips this step, read on the host: for optimizers whose update reads the host anyway
    (torch's Adafactor reads each parameter's norm) or has no device path for it (Lion)."""
    flag = found_inf(optimizer)
    return flag is not None and bool(flag)
