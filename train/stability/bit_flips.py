"""Test-only silent data corruption, off unless its environment variable is set (read when a step asks: not at
import, since a forked rank imported this module before its environment was its own).

    SLURMTRAIN_TEST_FLIP_BITS="RANK:STEP[:ATTEMPT]"   after STEP's update, the top mantissa bit of the middle
                                                      element of RANK's first compared tensor flips (ATTEMPT: only
                                                      in that SLURM attempt, as the watchdog's injectors read it)

A hardware fault, not a bad batch: it fires once per process, not again when a rollback replays STEP.
"""

from __future__ import annotations

import os

import torch

from train.stability.fingerprint import words

FLIP_BITS_ENV = "SLURMTRAIN_TEST_FLIP_BITS"
_fired = False


def active() -> bool:
    return bool(os.environ.get(FLIP_BITS_ENV))


def flip(step: int, rank: int, tensors: list[torch.Tensor]) -> None:
    global _fired
    from train.faults.watchdog import _injection

    if _fired or not tensors or _injection(FLIP_BITS_ENV, rank) != step:
        return
    _fired = True
    w = words(tensors[0])  # a view of the tensor's storage (parameters are contiguous)
    bit = 8 * w.element_size() - 10  # the top mantissa bit of fp32, bf16 and fp16 alike
    w[w.numel() // 2] ^= 1 << bit
