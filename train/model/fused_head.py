"""trainer.loss_impl=fused: the output layer's matmul and the cross-entropy (and z-loss) together, a chunk of tokens
at a time, so that neither the bf16 nor the fp32 logits of the micro batch ever exist (contract/rules/loss_chunks.py
says when it runs and what it holds).

Our transformer calls it in its forward when it is handed the targets (train/step.py does so when this path is
on): inside the model's forward, so FSDP has the output weight gathered and DDP sees it used, as for the logits.
On CUDA with cut-cross-entropy installed (`pip install -e .[cce]`) and no z-loss, its `linear_cross_entropy`
(Triton kernels, Apple's) runs instead; it is not tested here (no CUDA). Otherwise FusedLinearCrossEntropy: per
chunk, the logits, their loss and gradient (train/loss.py chunk_terms, compiled with strategy.compile), and from
that gradient the hidden states' and the weight's, made in forward (Liger's order: no matmul is recomputed in
backward) and scaled in backward by the incoming gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from contract.rules.loss_chunks import fused_rows
from train.data.batches import IGNORE_INDEX
from train.loss import Losses, counted, terms_fn


class FusedLinearCrossEntropy(torch.autograd.Function):
    """(cross-entropy + z_coef x z-loss, cross-entropy, z-loss) of hidden states `h` (N, d) against the output
    weight `weight` (vocab, d): means over the counted targets. The matmuls run in `dtype` (autocast's), the loss
    arithmetic in fp32; only the first output is differentiable."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int,
                z_coef: float, compiled: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        count = counted(targets).clamp(min=1)
        scale = 1.0 / count.to(torch.float32)
        terms = terms_fn(compiled)
        w = weight.to(dtype)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        ce = torch.zeros((), dtype=torch.float32, device=h.device)
        z = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, h.shape[0], rows):
            hc = h[start:start + rows].to(dtype)
            chunk_ce, chunk_z, g = terms(hc @ w.t(), targets[start:start + rows], scale, z_coef, dtype)
            ce += chunk_ce
            z += chunk_z
            grad_h[start:start + rows] = g @ w
            grad_w += g.t() @ hc
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ce, z = ce * scale, z_coef * z * scale
        ctx.mark_non_differentiable(ce, z)
        return ce + z, ce, z

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        g = grad_total.to(torch.float32)
        return (grad_h.mul_(g.to(grad_h.dtype)), grad_w.mul_(g).to(ctx.weight_dtype), None, None, None, None,
                None)


def compute_dtype(device: torch.device, fallback: torch.dtype) -> torch.dtype:
    """The dtype autocast gives a matmul here (the forward runs inside the strategy's autocast), else `fallback`."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return fallback


def cce_function() -> Any:
    """cut-cross-entropy's linear_cross_entropy, or None where it is not installed (it needs Triton and CUDA)."""
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError:
        return None
    return linear_cross_entropy


class FusedHeadLoss:
    """What our transformer's forward hands the final norm's output, the output weight and the targets to."""

    def __init__(self, z_coef: float, compiled: bool) -> None:
        self.z_coef, self.compiled = float(z_coef), compiled
        self._cce: Any = False  # looked up at the first CUDA call

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> Losses:
        h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        dtype = compute_dtype(h.device, weight.dtype)
        if h.device.type == "cuda" and not self.z_coef:
            if self._cce is False:
                self._cce = cce_function()
            if self._cce is not None:
                total = self._cce(h.to(dtype), weight.to(dtype), t, ignore_index=IGNORE_INDEX, reduction="sum")
                ce = total.float() / counted(t).clamp(min=1)
                return ce, ce, None
        with torch.autocast(h.device.type, enabled=False):
            total, ce, z = FusedLinearCrossEntropy.apply(h, weight, t, fused_rows(weight.shape[0]), self.z_coef,
                                                         self.compiled, dtype)
        return total, ce, z if self.z_coef else None


def attach(model: torch.nn.Module, cfg: Any) -> bool:
    """trainer.loss_impl=fused: give our transformer the fused loss (before any wrapping); whether it is on. The
    launch refused what can't take it (contract/rules/loss_chunks.py fused_refusal); the ranks check it again."""
    from contract.errors import ConfigError
    from contract.rules.loss_chunks import fused_refusal, impl

    if impl(cfg) != "fused":
        return False
    reason = fused_refusal(cfg)
    if reason:
        raise ConfigError(reason)
    model.head_loss = FusedHeadLoss(float(cfg.optim.get("z_loss", 0.0) or 0.0),  # type: ignore[assignment]
                                    bool(cfg.strategy.get("compile")))
    return True
