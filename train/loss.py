"""The training loss of a micro batch: cross-entropy averaged over the targets that count (IGNORE_INDEX ones, a
supervised fine-tuning prompt's or padding, are left out), and 0 rather than NaN when none counts (a packed window
of prompt only, a padded record cut before its response): such a micro batch trains nothing, and is no fault."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from train.data.batches import IGNORE_INDEX


def counted(flat_targets: torch.Tensor) -> torch.Tensor:
    """How many targets count in the loss (a tensor: no sync)."""
    return (flat_targets != IGNORE_INDEX).sum()


def cross_entropy(flat_logits: torch.Tensor, flat_targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that count; `flat_logits` (N, vocab), float32."""
    total = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / counted(flat_targets).clamp(min=1)


class TokenCount:
    """The tokens the steps train, for state.tokens: global batch x seq_len a step, or with supervised fine-tuning
    data (`responses`) the targets that count in the loss over every rank's micro batches, summed over the world
    and divided by the ranks that read the same samples (tensor-parallel peers, pipeline stages). Those stay on the
    device until `settle()`, which the loop calls only where it reads state.tokens (a log step, a save): there one
    all-reduce and one read cover every step since the last."""

    def __init__(self, responses: bool, per_step: int, peers: int, device: torch.device) -> None:
        self.responses, self.per_step, self.peers = responses, per_step, peers
        self.local = torch.zeros((), dtype=torch.int64, device=device)
        self.steps = 0

    def add(self, targets: torch.Tensor) -> None:
        if self.responses:
            self.local += counted(targets.reshape(-1))

    def step_done(self) -> None:
        self.steps += 1

    def settle(self) -> int:
        """The tokens of the steps done since the last settle (a collective with `responses`: every rank calls it
        at the same step)."""
        steps, self.steps = self.steps, 0
        if not self.responses:
            return self.per_step * steps
        import torch.distributed as dist

        total = self.local.clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total)
        self.local.zero_()
        return int(total.item()) // self.peers
