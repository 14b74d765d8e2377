"""The cross-group average (train/replicas/averaging.py) over a stand-in for torchft's Manager whose all-reduce is the
mean of every group's buffer: which groups took part, and a DiLoCo group that healed in the sync (its pseudo-gradient
a copy of its source group's) left out of the mean instead of counted twice."""

from __future__ import annotations

import threading
from typing import Any

import torch

from train.replicas.averaging import CrossGroupAverage


def _mean(tensors: list[torch.Tensor]) -> None:
    mean = torch.stack(tensors).sum(0) / len(tensors)
    for t in tensors:
        t.copy_(mean)


class _Hub:
    """n groups' Managers: the k-th all-reduce of every group is averaged once all n have called it."""

    def __init__(self, n: int) -> None:
        self.n, self.lock, self.calls = n, threading.Lock(), {}

    def manager(self) -> Any:
        hub, count = self, [0]

        class Work:
            def __init__(self, barrier: threading.Barrier) -> None:
                self.barrier = barrier

            def wait(self) -> None:
                self.barrier.wait(timeout=30)

        class Manager:
            def allreduce(self, t: torch.Tensor) -> Work:
                index = count[0]
                count[0] += 1
                with hub.lock:
                    if index not in hub.calls:
                        tensors: list[torch.Tensor] = []
                        hub.calls[index] = (tensors, threading.Barrier(hub.n, action=lambda ts=tensors: _mean(ts)))
                    hub.calls[index][0].append(t)
                    return Work(hub.calls[index][1])

            def num_participants(self) -> int:
                return hub.n

        return Manager()


def _run(grads: list[torch.Tensor], counted: list[bool]) -> list[tuple[list[torch.Tensor], list[int]]]:
    n = len(grads)
    hub = _Hub(n)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    out: list[Any] = [None] * n

    def one(k: int) -> None:
        present, _ = CrossGroupAverage(hub.manager(), k, n).average([params[k]], counted=counted[k])
        out[k] = (params[k].grad, present)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_every_group_counted_gets_the_plain_mean() -> None:
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0]), torch.tensor([5.0, 1.0])]
    for got, present in _run(grads, [True, True, True]):
        assert torch.equal(got, torch.stack(grads).sum(0) / 3) and present == [0, 1, 2]


def test_a_group_that_healed_in_the_sync_is_left_out_of_the_mean() -> None:
    """Group 2 healed from group 0: its pseudo-gradient is group 0's. Counted, group 0 would weigh twice
    ((2a + b) / 3); left out, every group gets (a + b) / 2, the sync the groups that trained the interval make."""
    a, b = torch.tensor([1.0, 2.0, -4.0]), torch.tensor([3.0, 6.0, 0.5])
    results = _run([a, b, a.clone()], [True, True, False])
    for got, present in results:
        torch.testing.assert_close(got, (a + b) / 2, rtol=0, atol=1e-6)
        assert present == [0, 1]
