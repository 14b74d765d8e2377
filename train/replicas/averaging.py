"""The cross-group all-reduce: every gradient this rank holds (an FSDP2 shard's local part, a DDP replica's whole
gradient, already reduced inside the group) averaged over the groups in the quorum, in one flat buffer per dtype.

manager.allreduce is called directly (torchft's DDP wrapper crashes the survivor when a peer dies mid-all-reduce: a
failed all-reduce here only makes should_commit() say no). The float32 buffer carries one more slot per group: a 1 in
this group's (0 when its gradients must not count: they are zeroed and the mean rescaled to the groups that do), so
that the average times the participants says which groups took part in the step, and one more
per group with the stop its ranks agreed on (train/faults/preemption.py's kinds), so that every group hears every
group's ask at the same exchange (stops.py decides who stops).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from train.replicas.stops import Asks


def _local_grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:  # a parameter the step left without a gradient: zero here, as in every group
        p.grad = torch.zeros_like(p)
    g = p.grad
    return g.to_local() if hasattr(g, "to_local") else g


class CrossGroupAverage:
    def __init__(self, manager: Any, group: int, groups: int) -> None:
        self.manager, self.group, self.groups = manager, group, groups
        self.allreduces = 0  # counted: benchmarks and tests compare communication schemes by it

    def average(self, params: Sequence[torch.Tensor], stop: int = 0, counted: bool = True) -> tuple[list[int], Asks]:
        """Average the gradients of `params` over the quorum's groups, in place; returns the groups that took part
        (their order: the group index; `counted` False: a DiLoCo group that healed in this sync, whose interval is
        not its own: its data is not counted as trained and its gradients, a copy of its source group's, are left
        out of the mean, which is then that of the other groups) and the `stop` each group sent, with the quorum's
        size. A failed all-reduce leaves garbage, which the caller's commit vote discards."""
        grads = [_local_grad(p) for p in params if p.requires_grad]
        if not counted:  # its share is not one of its own (a DiLoCo heal copied a peer's): it adds nothing
            torch._foreach_zero_(grads)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        member = torch.zeros(2 * self.groups, dtype=torch.float32, device=grads[0].device if grads else "cpu")
        member[self.group], member[self.groups + self.group] = float(counted), float(stop)
        by_dtype.setdefault(torch.float32, [])
        works = []
        flats = {}
        for dtype, tensors in by_dtype.items():
            parts = tensors + ([member] if dtype == torch.float32 else [])
            flat = _flatten_dense_tensors(parts)
            flats[dtype] = (flat, parts)
            works.append(self.manager.allreduce(flat))
            self.allreduces += 1
        for work in works:
            work.wait()
        for flat, parts in flats.values():
            torch._foreach_copy_(parts, list(_unflatten_dense_tensors(flat, parts)))
        n = self.manager.num_participants()
        values = [round(float(v) * n) for v in member.tolist()]
        counting = sum(values[:self.groups])
        if 0 < counting < n:  # the mean of the groups that count: the others sent zeros
            torch._foreach_mul_(grads, n / counting)
        asks = Asks({g: values[self.groups + g] for g in range(self.groups) if values[self.groups + g] > 0}, n)
        return [g for g in range(self.groups) if values[g] == 1], asks
