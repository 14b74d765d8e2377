"""Which checkpoints a rollback may go back to and the stop line may call good (blowup.py's rules on each marker).

Not one whose loss blew far above the best of its time, not one that collapsed to a random model's loss (ln(vocab)
after the run had been below it, or with a vanishing gradient norm), and not one from which training went non-finite
at its very next step after a rollback to it: rolling back to dead weights again only repeats the same failure.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from contract.rules.blowup import collapsed, far_above, reference
from contract.rundir import ckpt_layout as layout

BLOWN = "its loss is far above the best"
COLLAPSED = "its loss sits at a random model's"
DEAD = "training went non-finite at once from it after a rollback to it"


class Targets:
    def __init__(self, run_dir: Path, vocab_size: int | None, margin: float) -> None:
        self.run_dir, self.vocab_size, self.margin = Path(run_dir), vocab_size, margin
        self.dead: set[int] = set()
        self.rolled_to: int | None = None  # the checkpoint of the newest rollback

    def why_not(self, step: int) -> str | None:
        """Why the checkpoint of `step` is no good (None: it is, or its marker says nothing of its loss). Judged
        by the best the run had reached by then (its marker's), not the best reached since: a checkpoint from early
        in a run that went on learning is good."""
        if step in self.dead:
            return DEAD
        checkpoint = layout.CheckpointDir(step, layout.step_dir(self.run_dir, step))
        loss, best = layout.marker_losses(checkpoint)
        if best is None:
            return None
        if far_above(loss, reference(best, self.vocab_size), self.margin):
            return BLOWN
        norm = layout.marker(checkpoint).get("grad_norm")
        if collapsed(loss, best, self.vocab_size, norm if isinstance(norm, int | float) else None):
            return COLLAPSED
        return None

    def good(self, first: int) -> Callable[[int], bool]:
        """A checkpoint to go back to: from before the first bad step, and good."""
        return lambda s: s < first and self.why_not(s) is None

    def trouble_from(self, first: int) -> None:
        """The trouble's first bad step: right after the checkpoint the last rollback went to, that one is dead."""
        if self.rolled_to is not None and first == self.rolled_to + 1:
            self.dead.add(self.rolled_to)


def plain_norm(norm: Any) -> float | None:
    """A gradient norm as a number where reading it is this rank's own business (a plain tensor or a number; a
    DTensor's would be a collective), else None."""
    if isinstance(norm, int | float):
        return float(norm)
    if type(norm) is torch.Tensor and norm.numel() == 1:
        return float(norm)
    return None
