"""Each step's code from the device to the host without waiting for it.

The code is copied into a host buffer (pinned on a GPU) behind the step's work, and on a GPU an event marks when it
is there: `ready()` returns the codes whose copies have completed (never blocking), `drain()` waits for all of them
(at a log step the loss read has already waited; at a rollback or the end, once). The host reads the buffer through
a numpy view of the same memory: no tensor operation, so no host read that the sync guard (train/observe/
sync_count.py) would count, and the same path on every device (on a CPU the copy is done when copy_ returns, and
there is no event to wait for).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

# Steps in flight at most before the oldest slot is reused: far more than a host ever runs ahead of its device.
SLOTS = 1024


class DeviceCodes:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.zeros(SLOTS, dtype=torch.float32, pin_memory=self.cuda)
        self.values = self.host.numpy()  # the same memory, read without a tensor operation
        # (step, slot, event): the event is None where the copy completed as it was made (a CPU).
        self.pending: deque[tuple[int, int, Any]] = deque()

    def push(self, step: int, code: torch.Tensor) -> None:
        if len(self.pending) >= SLOTS and self.pending[0][2] is not None:  # a host SLOTS steps ahead: wait
            self.pending[0][2].synchronize()
        slot = step % SLOTS
        self.host[slot].copy_(code, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append((step, slot, event))

    def ready(self) -> list[tuple[int, int]]:
        """(step, code) of every step whose code has reached the host, oldest first; never waits."""
        out = []
        pending = self.pending
        while pending and (pending[0][2] is None or pending[0][2].query()):
            step, slot, _ = pending.popleft()
            out.append((step, int(self.values[slot])))
        return out

    def drain(self) -> list[tuple[int, int]]:
        """Every pushed step's code: waits for the device (once)."""
        if self.pending and self.pending[-1][2] is not None:
            self.pending[-1][2].synchronize()
        return self.ready()

    def clear(self) -> None:
        self.pending.clear()
