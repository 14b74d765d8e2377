"""The training loss of a micro batch: cross-entropy averaged over the targets that count (IGNORE_INDEX ones, a
supervised fine-tuning prompt's or padding, are left out), and 0 rather than NaN when none counts (a packed window
of prompt only, a padded record cut before its response): such a micro batch trains nothing, and is no fault.
z-loss (optim.z_loss) is computed with it, in the same pass. Which path runs (plain, chunked, or fused with the
output layer in train/model/fused_head.py) is contract/rules/loss_chunks.py's rule."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from contract.rules.loss_chunks import chunk_rows
from train.data.batches import IGNORE_INDEX

Losses = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # (what backward takes, cross-entropy, z-loss)


def counted(flat_targets: torch.Tensor) -> torch.Tensor:
    """How many targets count in the loss (a tensor: no sync)."""
    return (flat_targets != IGNORE_INDEX).sum()


def cross_entropy(flat_logits: torch.Tensor, flat_targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that count; `flat_logits` (N, vocab) in any float dtype, computed in
    float32. A large vocabulary's loss runs in chunks of rows (contract/rules/loss_chunks.py): no fp32 copy of the
    whole logits."""
    return losses(flat_logits, flat_targets)[1]


def losses(flat_logits: torch.Tensor, flat_targets: torch.Tensor, z_coef: float = 0.0,
           compiled: bool = False) -> Losses:
    """(cross-entropy + z_coef x z-loss, cross-entropy, z-loss or None without z_coef) of (N, vocab) logits; only
    the first is differentiable on the chunked path. `compiled`: each chunk's arithmetic through torch.compile."""
    rows = chunk_rows(flat_logits.shape[0], flat_logits.shape[-1])
    if rows is not None and flat_logits.requires_grad:
        total, ce, z = ChunkedCrossEntropy.apply(flat_logits, flat_targets, rows, float(z_coef), compiled)
        return total, ce, z if z_coef else None
    logits = flat_logits.float()
    ce = F.cross_entropy(logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum")
    ce = ce / counted(flat_targets).clamp(min=1)
    if not z_coef:
        return ce, ce, None
    mask = (flat_targets != IGNORE_INDEX).float()
    z = z_coef * (torch.logsumexp(logits, dim=-1).pow(2) * mask).sum() / mask.sum().clamp(min=1)
    return ce + z, ce, z


def chunk_terms(x: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, z_coef: float,
                out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's arithmetic: (sum of cross-entropy, sum of logsumexp^2, over the targets that count; the gradient
    of (cross-entropy + z_coef x logsumexp^2) x `scale` with respect to the chunk's logits `x`, in `out_dtype`).
    d/dx = softmax(x) x (1 + 2 z_coef lse) - onehot(target), rows whose target does not count zeroed. One fp32
    tensor of the chunk: log-softmax upcasts as it reads (no fp32 copy first), and becomes the gradient in place."""
    logp = torch.log_softmax(x, dim=-1, dtype=torch.float32)
    keep = (targets != IGNORE_INDEX).to(torch.float32)
    index = targets.clamp(min=0).unsqueeze(1)
    target_logp = logp.gather(1, index).squeeze(1)
    lse = x.gather(1, index).squeeze(1).to(torch.float32) - target_logp  # log-sum-exp, from the target's column
    ce = -(target_logp * keep).sum()
    z = (lse * lse * keep).sum()
    p = logp.exp_()  # softmax, in place
    row = keep * scale
    p.mul_((row * (1 + 2 * z_coef * lse)).unsqueeze(1) if z_coef else row.unsqueeze(1))
    p.scatter_add_(1, index, (-row).unsqueeze(1))
    return ce, z, p.to(out_dtype)


@functools.cache
def compiled_terms() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """chunk_terms through torch.compile (torchtitan compiles its loss): its element-wise work and reductions fused
    into a few kernels, in place of a dozen eager ones a chunk."""
    return torch.compile(chunk_terms, dynamic=False)  # type: ignore[return-value]


def terms_fn(compiled: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """chunk_terms, compiled on its own with `compiled`; inside a model compiled whole (strategy.compile_unit=model,
    the fused loss in its forward) plain, as the whole graph's compile traces it."""
    if not compiled or torch.compiler.is_compiling():
        return chunk_terms
    return compiled_terms()


class ChunkedCrossEntropy(torch.autograd.Function):
    """(cross-entropy + z_coef x z-loss, cross-entropy, z-loss), means over the counted targets, of (N, vocab)
    logits, `rows` of them upcast to fp32 at a time. The gradient of the logits is made in forward, chunk by chunk,
    in the logits' dtype (what the plain loss's cast back gives too), and scaled in backward by the incoming
    gradient of the first output (the other two are for the log): no fp32 tensor of the whole logits ever exists."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, rows: int, z_coef: float = 0.0,
                compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        count = counted(targets).clamp(min=1)
        scale = 1.0 / count.to(torch.float32)
        terms = terms_fn(compiled)
        grad = torch.empty_like(logits)
        ce = torch.zeros((), dtype=torch.float32, device=logits.device)
        z = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], rows):
            chunk_ce, chunk_z, grad[start:start + rows] = terms(logits[start:start + rows],
                                                                targets[start:start + rows], scale, z_coef,
                                                                logits.dtype)
            ce += chunk_ce
            z += chunk_z
        ctx.save_for_backward(grad)
        ce, z = ce * scale, z_coef * z * scale
        ctx.mark_non_differentiable(ce, z)
        return ce + z, ce, z

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_total.to(grad.dtype)), None, None, None, None
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
