"""Replica consistency: the ranks that should hold identical weights compare an exact fingerprint of them.

Which ranks and which tensors is the strategy's answer (Strategy.replica_set): DDP ranks and ZeRO-1/2 ranks hold
every parameter whole, HSDP replicas hold the same shards across the replicate dimension, a tensor / pipeline
layout's replicas are the ranks of the same stage and tensor-parallel index; plain FSDP (and ZeRO-3) shards share
only their replicated 0-dim parameters, if any. Every `stability.replica_check_every` steps and before every save,
each rank fingerprints its tensors (train/stability/fingerprint.py) and the small vectors are all-gathered on a CPU
group: every rank sees every rank's and reaches the same verdict. Within a group of replicas, the ranks outside a
strict majority hold corrupted weights (silent data corruption); with no strict majority (two replicas, an even
split) every rank of the group is a suspect and none can be named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from train.distributed import cpu_group
from train.observe.metrics import log
from train.stability import bit_flips
from train.stability.fingerprint import fingerprint


@dataclass
class Disagreement:
    """What a failed check found (the same on every rank)."""
    step: int
    bad: list[int] = field(default_factory=list)  # ranks outside the strict majority of their replica group
    suspects: list[int] = field(default_factory=list)  # ranks of groups with no strict majority
    majority: dict[int, list[int]] = field(default_factory=dict)  # each named rank's majority (its ranks)
    tensors: list[str] = field(default_factory=list)  # names of the tensors that differ (the first few)

    @property
    def named(self) -> list[int]:
        return self.bad or self.suspects


Row = tuple[tuple[int, ...], list[int]]  # a rank's replica key and its fingerprint


def judge(step: int, keys: list[tuple[int, ...]], prints: list[list[int]], names: list[list[str]]) -> Disagreement | None:
    """The verdict on every rank's fingerprint (index: rank): None where every group of replicas agrees."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    found = Disagreement(step)
    for ranks in groups.values():
        votes = Counter(tuple(prints[r]) for r in ranks)
        if len(votes) < 2:
            continue
        value, count = votes.most_common(1)[0]
        if 2 * count > len(ranks):
            holders = [r for r in ranks if tuple(prints[r]) == value]
            odd = [r for r in ranks if r not in holders]
            found.bad += odd
            found.majority.update({r: holders for r in odd})
            reference = list(value)
        else:
            found.suspects += ranks
            odd, reference = ranks[1:], prints[ranks[0]]
        for r in odd:
            differ = [i // 2 for i in range(0, len(reference), 2) if prints[r][i:i + 2] != reference[i:i + 2]]
            found.tensors += [names[r][i] for i in differ if names[r][i] not in found.tensors][:4]
    return found if found.named else None


class ReplicaCheck:
    """Every rank builds one (a collective: the ranks exchange their replica keys, hosts and tensor names)."""

    def __init__(self, every: int, env: Any, strategy: Any) -> None:
        self.every, self.rank = int(every), env.rank
        self.found: Disagreement | None = None
        self.last: tuple[int, bool] | None = None  # (step, consistent) of the newest check
        self.passed: list[int] = []  # the newest steps at which the replicas agreed
        key, named = strategy.replica_set()
        self.tensors = [t for _, t in named]
        self.enabled = self.every > 0 and dist.is_initialized() and env.world_size > 1
        if not self.enabled:
            return
        self.group = cpu_group()
        rows = self._gather((tuple(key), env.node, [n for n, _ in named]))
        self.keys, self.hosts, self.names = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        sizes = Counter((k, len(n)) for k, _, n in rows if n)
        self.enabled = any(count > 1 for count in sizes.values())
        if not self.enabled and env.is_main:
            log.info("stability.replica_check_every: nothing to compare: %s", strategy.replica_note())

    def _gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value, group=self.group)
        return out

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def after_step(self, step: int) -> Disagreement | None:
        """Every rank, after every optimizer step: the periodic check where one is due."""
        if bit_flips.active():
            bit_flips.flip(step, self.rank, self.tensors)
        return self.check(step) if self.due(step) else None

    def check(self, step: int) -> Disagreement | None:
        """Collective: every rank, at the same step. Cached for the step (a save at a check step checks once)."""
        if self.last is not None and self.last[0] == step:
            return None if self.last[1] else self.found
        prints = self._gather(fingerprint(self.tensors))
        self.found = judge(step, self.keys, prints, self.names)
        self.last = (step, self.found is None)
        if self.found is None:
            self.passed = [*self.passed[-15:], step]
        return self.found

    def verified(self, step: int) -> bool:
        """Whether the replicas were checked and agreed at `step` (a checkpoint of that step records it)."""
        return step in self.passed

    def describe(self, found: Disagreement) -> str:
        """Who disagrees, for the log, the events and the one line."""
        def who(ranks: list[int]) -> str:
            return ", ".join(f"rank {r} ({self.hosts[r]})" for r in ranks)

        what = f" in {', '.join(found.tensors)}" if found.tensors else ""
        if found.bad:
            holders = sorted({r for rs in found.majority.values() for r in rs})
            return f"{who(found.bad)} disagree{'s' if len(found.bad) == 1 else ''} with the majority of " \
                   f"{'its' if len(found.bad) == 1 else 'their'} replicas ({who(holders)}){what}"
        return f"the replicas {who(found.suspects)} disagree{what}, with no majority to tell which is wrong"
