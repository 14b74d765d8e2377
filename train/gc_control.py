"""Python's garbage collector kept off the step (torchtitan's GarbageCollection): a full collection at a step
can stall one rank for tens of milliseconds and make every other rank wait for it at the next collective.

After set-up, what exists (the model, the optimizer, the data index) is collected once and frozen, so later
collections never walk it again; automatic collection is then off and a young-generation collection runs every
trainer.gc_every steps instead. Reference cycles made in between wait at most that many steps. close() gives the
process its collector back (a test, or a notebook, calling train() keeps working as before).
"""

from __future__ import annotations

import gc


class GcControl:
    """trainer.gc_every: collect every this many steps, automatic collection off in between; 0: Python's own."""

    def __init__(self, every: int) -> None:
        self.every = int(every)
        self.active = False
        self._was_enabled = gc.isenabled()

    def start(self) -> None:
        """After set-up: collect what set-up left behind, freeze the survivors, turn automatic collection off."""
        if self.every <= 0 or self.active:
            return
        gc.collect()
        gc.freeze()
        gc.disable()
        self.active = True

    def step(self, step: int) -> None:
        """After optimizer step `step`: a collection of the young generations when due."""
        if self.active and step % self.every == 0:
            gc.collect(1)

    def close(self) -> None:
        if not self.active:
            return
        self.active = False
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
