"""The training loss of a micro batch: cross-entropy averaged over the targets that count (IGNORE_INDEX ones, a
supervised fine-tuning prompt's or padding, are left out), and 0 rather than NaN when none counts (a packed window
of prompt only, a padded record cut before its response): such a micro batch trains nothing, and is no fault."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from contract.rules.loss_chunks import chunk_rows
from train.data.batches import IGNORE_INDEX


def counted(flat_targets: torch.Tensor) -> torch.Tensor:
    """How many targets count in the loss (a tensor: no sync)."""
    return (flat_targets != IGNORE_INDEX).sum()


def cross_entropy(flat_logits: torch.Tensor, flat_targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that count; `flat_logits` (N, vocab) in any float dtype, computed in
    float32. A large vocabulary's loss runs in chunks of rows (contract/rules/loss_chunks.py): no fp32 copy of the
    whole logits."""
    rows = chunk_rows(flat_logits.shape[0], flat_logits.shape[-1])
    if rows is not None and flat_logits.requires_grad:
        return ChunkedCrossEntropy.apply(flat_logits, flat_targets, rows)
    total = F.cross_entropy(flat_logits.float(), flat_targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / counted(flat_targets).clamp(min=1)


class ChunkedCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of (N, vocab) logits, `rows` of them upcast to fp32 at a time. The gradient of the
    logits is made in forward, chunk by chunk, in the logits' dtype (what the plain loss's cast back gives too), and
    scaled in backward by the incoming gradient: no fp32 tensor of the whole logits ever exists. The loss is the sum
    over the chunks of logsumexp minus the target's logit, over the targets that count."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        count = counted(targets).clamp(min=1)
        grad = torch.empty_like(logits)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], rows):
            x = logits[start:start + rows].to(torch.float32, copy=True)  # worked on in place
            t = targets[start:start + rows]
            keep = (t != IGNORE_INDEX).unsqueeze(1)
            index = t.clamp(min=0).unsqueeze(1)
            lse = torch.logsumexp(x, dim=-1, keepdim=True)
            total += ((lse - x.gather(1, index)) * keep).sum()
            x.sub_(lse).exp_()  # softmax, in place of the fp32 chunk
            x.scatter_add_(1, index, torch.full_like(index, -1, dtype=x.dtype))
            x.mul_(keep / count)
            grad[start:start + rows] = x
        ctx.save_for_backward(grad)
        return total / count

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_output.to(grad.dtype)), None, None


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
