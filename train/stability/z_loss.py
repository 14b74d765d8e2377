"""z-loss (PaLM, OLMo): coefficient x the mean over target tokens of logsumexp(logits)^2, added to the loss."""

from __future__ import annotations

import torch

from train.loss import cross_entropy


class ZLoss:
    def __init__(self, coefficient: float) -> None:
        self.coefficient = float(coefficient)
        self.last: torch.Tensor | None = None  # the last step's z-loss on this rank (a tensor: no sync)

    def losses(self, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
        """(cross-entropy, z-loss term) of one micro batch; `logits` in float32, shape (N, vocab)."""
        ce = cross_entropy(logits, targets)
        mask = (targets != ignore_index).float()
        z = self.coefficient * (torch.logsumexp(logits, dim=-1).pow(2) * mask).sum() / mask.sum().clamp(min=1)
        return ce, z
