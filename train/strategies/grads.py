"""Gradient arithmetic the strategies share: the global norm of gradients on different device meshes
(`total_norm`), and a sum over a process group as one flat buffer (`all_reduce_flat`).

Under tensor parallelism with FSDP most gradients are DTensors on the (data-parallel, tp) mesh, while a MoE layer's,
whole on every tp rank (train/strategies/tensor_parallel.py), are sharded over the data-parallel mesh only, and the
experts under ep are plain tensors: torch's get_total_norm takes one mesh at a time. Each mesh's norm is made whole
(`full_tensor`), then they combine; with one kind of gradient it is get_total_norm's own result, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of `grads`, whole (a plain tensor)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = []
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm(members, norm_type=2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1:
        return norms[0]
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0]) for n in norms]))


def all_reduce_flat(tensors: list[torch.Tensor], group: Any, divisor: int = 1) -> None:
    """Sum `tensors` over `group` (None: no sum) as one flat buffer, divided by `divisor`, written back in place."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if group is not None:
        dist.all_reduce(flat, group=group)
    if divisor != 1:
        flat /= divisor
    torch._foreach_copy_(tensors, [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in tensors]), tensors,
                                                                strict=True)])
