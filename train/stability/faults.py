"""Test-only fault injection, off unless its environment variable is set (read once, at the first step that asks:
not at import, since a forked rank imported this module before its environment was its own).

    SLURMTRAIN_TEST_NAN_GRAD="STEP:RANK[,STEP:RANK...]"  RANK's loss, hence its gradients, become NaN at STEP
    SLURMTRAIN_TEST_SPIKE_BATCH="STEP[,STEP...]"          every rank trains STEP on a batch of one repeated token

Both model a bad batch: they fire at STEP and again whenever the same data position is trained again (a step
replayed after a rollback that did not skip its samples), not at a replayed STEP that reads other samples.
"""

from __future__ import annotations

import os

import torch

NAN_GRAD_ENV = "SLURMTRAIN_TEST_NAN_GRAD"
SPIKE_BATCH_ENV = "SLURMTRAIN_TEST_SPIKE_BATCH"


def _pairs(spec: str) -> set[tuple[int, int]]:
    return {(int(s), int(r)) for s, r in (item.split(":") for item in spec.split(",") if item)}


NAN_AT: set[tuple[int, int]] = set()
SPIKE_AT: set[int] = set()
_read = False


def active() -> bool:
    """Whether a fault is asked for in this process (its environment, read the first time)."""
    global _read, NAN_AT, SPIKE_AT
    if not _read:
        _read = True
        NAN_AT = NAN_AT or _pairs(os.environ.get(NAN_GRAD_ENV, ""))
        SPIKE_AT = SPIKE_AT or {int(s) for s in os.environ.get(SPIKE_BATCH_ENV, "").split(",") if s}
    return bool(NAN_AT or SPIKE_AT)


_bad_positions: set[tuple[str, int, int]] = set()
_fired: set[tuple[str, int, int]] = set()


def _fires(kind: str, step: int, position: int, rank: int, wanted: bool) -> bool:
    if wanted and (kind, step, rank) not in _fired:
        _fired.add((kind, step, rank))
        _bad_positions.add((kind, position, rank))
    return (kind, position, rank) in _bad_positions


def loss(value: torch.Tensor, step: int, position: int, rank: int) -> torch.Tensor:
    """`value` times NaN on RANK at STEP (`position`: the step's first global sample)."""
    return value * float("nan") if _fires("nan", step, position, rank, (step, rank) in NAN_AT) else value


def batch(inputs: torch.Tensor, targets: torch.Tensor, step: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of one repeated token, each followed by another fixed one: nothing like the data."""
    if not _fires("spike", step, position, 0, step in SPIKE_AT):
        return inputs, targets
    return torch.full_like(inputs, 3), torch.full_like(targets, 5)
