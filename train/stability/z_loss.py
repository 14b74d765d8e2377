"""z-loss (PaLM, OLMo): coefficient x the mean over target tokens of logsumexp(logits)^2, added to the loss. It is
computed with the cross-entropy, in the same pass (train/loss.py losses, train/model/fused_head.py); this holds
its coefficient and the last step's value for the log."""

from __future__ import annotations

import torch

from train.data.batches import IGNORE_INDEX
from train.loss import losses


class ZLoss:
    def __init__(self, coefficient: float) -> None:
        self.coefficient = float(coefficient)
        self.last: torch.Tensor | None = None  # the last step's z-loss on this rank (a tensor: no sync)

    def losses(self, logits: torch.Tensor, targets: torch.Tensor,
               ignore_index: int = IGNORE_INDEX) -> tuple[torch.Tensor, torch.Tensor]:
        """(cross-entropy, z-loss term) of one micro batch; `logits` (N, vocab) in any float dtype. The targets
        that don't count are train.data's IGNORE_INDEX (the only `ignore_index` taken)."""
        assert ignore_index == IGNORE_INDEX, ignore_index
        _, ce, z = losses(logits, targets, self.coefficient)
        assert z is not None
        return ce, z
