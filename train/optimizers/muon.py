"""Muon for the 2-D weights of the model's repeated blocks and AdamW for everything else, as one optimizer.

The Muon update is torch's (torch.optim.Muon: momentum, Nesterov, Keller Jordan's Newton-Schulz iteration in
bfloat16, decoupled weight decay), with its learning rate matched to AdamW's update RMS (`match_rms_adamw`,
Moonlight's 0.2 sqrt(max(A, B))), so that optim.lr and optim.weight_decay serve both parts. What torch's class can't
do is done here:

- Sharded matrices (FSDP, HSDP, tensor parallelism: DTensors) are gathered whole for the orthogonalisation, one
  matrix at a time, and each rank keeps its shard of the result (Moonlight's and torchtitan's distributed Muon);
  the momentum buffer stays sharded like the parameter. Every rank orthogonalises every matrix (simple and
  deterministic; dividing the matrices over the ranks, as Keller Jordan's distributed Muon does, would save that
  compute at the cost of a second exchange).
- A step the stability verdict skips (`found_inf` 1.0) leaves parameters and buffers untouched, on the device:
  the AdamW part is torch's fused AdamW, which takes the flag itself.
- One optimizer, so that checkpoints (DCP), the schedule and the skip see one state dict and one set of groups.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _adjust_lr, _zeropower_via_newtonschulz

from train.optimizers.sharded import found_inf, local

ADJUST_LR = "match_rms_adamw"


class MuonWithAdamW(torch.optim.AdamW):
    """`groups`: param groups, each with "muon": True (2-D weights of blocks) or False (AdamW). Muon groups read
    momentum, nesterov and ns_steps; all read lr and weight_decay; the AdamW groups betas and eps."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float], eps: float,
                 momentum: float, nesterov: bool, ns_steps: int, fused: bool = True) -> None:
        for group in groups:
            if group["muon"]:
                bad = [tuple(p.shape) for p in group["params"] if p.dim() != 2]
                if bad:
                    raise ValueError(f"Muon steps 2-D parameters only, not {bad[0]}")
                group.update(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        super().__init__(groups, lr=lr, betas=betas, eps=eps, **({"fused": True} if fused else {"foreach": True}))

    def __setstate__(self, state: dict[str, Any]) -> None:
        """load_state_dict: AdamW's fix-ups (a step count in every state) for its own groups only."""
        groups = state["param_groups"]
        super().__setstate__({**state, "param_groups": [g for g in groups if not g.get("muon")]})
        self.param_groups = groups

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        groups = self.param_groups
        try:
            self.param_groups = [g for g in groups if not g["muon"]]
            loss = super().step(closure)  # fused AdamW reads found_inf itself
        finally:
            self.param_groups = groups
        skip = found_inf(self)
        for group in groups:
            if group["muon"]:
                self._muon_step(group, None if skip is None else skip.bool())
        return loss

    def _muon_step(self, group: dict[str, Any], skip: torch.Tensor | None) -> None:
        lr, weight_decay, momentum = float(group["lr"]), group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            param, grad, buf = local(p), local(p.grad), local(state["momentum_buffer"])
            new_buf = buf.lerp(grad, 1 - momentum)
            update = grad.lerp(new_buf, momentum) if group["nesterov"] else new_buf
            ortho = orthogonalised(p, update, group["ns_steps"])
            stepped = param.mul(1 - lr * weight_decay).add_(ortho, alpha=-_adjust_lr(lr, ADJUST_LR, p.shape))
            if skip is None:
                buf.copy_(new_buf)
                param.copy_(stepped)
            else:
                buf.copy_(torch.where(skip, buf, new_buf))
                param.copy_(torch.where(skip, param, stepped))


def orthogonalised(p: torch.Tensor, update: torch.Tensor, ns_steps: int) -> torch.Tensor:
    """The Newton-Schulz orthogonalisation of the update of parameter `p`, as this rank's part of it: computed on
    the whole matrix (gathered when `p` is sharded) and sliced back to `p`'s placement (no exchange)."""
    coefficients = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    if not isinstance(p, DTensor):
        return _zeropower_via_newtonschulz(update, coefficients, ns_steps, EPS)
    mesh, placements = p.device_mesh, p.placements
    full = DTensor.from_local(update, mesh, placements, shape=p.shape, stride=p.stride()).full_tensor()
    ortho = _zeropower_via_newtonschulz(full, coefficients, ns_steps, EPS)
    replicated = DTensor.from_local(ortho, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, placements).to_local()
