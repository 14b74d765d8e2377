"""Adafactor as torch writes it (torch.optim.Adafactor: its defaults, state and arithmetic), with out-of-place
updates: torch's in-place `norm().square_()` fails on an FSDP or tensor-parallel DTensor, whose reduction is partial
until all-reduced. DTensor carries out the reductions (a matrix's column factor and every norm are all-reduced; the row
factor stays with its rows). A step the stability verdict skips changes nothing, the step count included; the verdict
is read on the host, as torch's Adafactor reads each parameter's norm there anyway.
"""

from __future__ import annotations

from typing import Any

import torch

from train.optimizers.sharded import skipped_on_host, whole


class Adafactor(torch.optim.Adafactor):
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if skipped_on_host(self):
            return loss
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            row_vars: list[Any] = []
            col_vars: list[Any] = []
            variances: list[Any] = []
            steps: list[torch.Tensor] = []
            self._init_group(group, params, grads, row_vars, col_vars, variances, steps)
            for param, grad, row_var, col_var, variance, step in zip(params, grads, row_vars, col_vars, variances,
                                                                       steps, strict=True):
                _update(param, grad, row_var, col_var, variance, step, group)
        return loss


def _update(param: torch.Tensor, grad: torch.Tensor, row_var: Any, col_var: Any, variance: Any, step: torch.Tensor,
            group: dict[str, Any]) -> None:
    """torch's _single_tensor_adafactor for one parameter, out of place where a DTensor needs it."""
    lr, decay, weight_decay, d = float(group["lr"]), group["beta2_decay"], group["weight_decay"], group["d"]
    eps1, eps2 = group["eps"]
    if eps1 is None:
        eps1 = torch.finfo(param.dtype).eps
    step += 1
    step_float = step.item()
    one_minus_beta2_t = step_float**decay
    rho_t = min(lr, 1 / (step_float**0.5))
    alpha = max(eps2, whole(param.norm(2)).item() / (param.numel() ** 0.5)) * rho_t
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    squared = grad.square()
    if grad.dim() > 1:
        row_var.lerp_(squared.mean(dim=-1, keepdim=True), one_minus_beta2_t)
        col_var.lerp_(squared.mean(dim=-2, keepdim=True), one_minus_beta2_t)
        var_estimate = (row_var @ col_var) / row_var.mean(dim=-2, keepdim=True).clamp(min=eps1)
    else:
        variance.lerp_(squared, one_minus_beta2_t)
        var_estimate = variance
    update = var_estimate.clamp(min=eps1 * eps1).rsqrt() * grad
    denom = max(1.0, whole(update.norm(2)).item() / ((update.numel() ** 0.5) * d))
    param.add_(update, alpha=-alpha / denom)
