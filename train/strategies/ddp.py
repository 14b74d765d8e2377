"""DDP: a full replica per rank, gradients all-reduced in buckets laid out once, at construction.

DDP lays its buckets out twice: the first step reduces every gradient in one bucket in registration order, and
before the second forward it rebuilds them in the order the gradients became ready. An attempt resumed at step k
would run its first step on the first layout while the uninterrupted run had the rebuilt one, and with 3 or more
ranks a sum depends on where a gradient sits in the bucket (gloo's and NCCL's ring add each segment in another
rank order): the resumed run drifted in the last bits from its first step. `FixedBucketsDDP` hands the reducer
its parameters in reverse registration order (the order backward produces them, which DDP's rebuild
approximates) and rebuilds the buckets from that order at once, before any step, so no later rebuild happens and
every attempt's every step reduces on the same layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.strategies.base import Strategy
from train.strategies.grad_compression import DDPCompression, chosen
from train.strategies.limits import unused_refusal


class FixedBucketsDDP(DistributedDataParallel):
    """DistributedDataParallel whose buckets never change after construction (the module docstring says why)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Every parameter "ready" in the reducer's index order (here reverse registration), then the rebuild DDP
        # would do after the first step, now: it marks the buckets rebuilt, so forward never rebuilds them again.
        self.reducer._push_all_rebuilt_params()
        self.reducer._rebuild_buckets()

    def _build_params_for_reducer(self) -> tuple[list[nn.Parameter], list[bool]]:
        params, sparse = super()._build_params_for_reducer()
        return params[::-1], sparse[::-1]


class DDPStrategy(Strategy):
    """Full replica per rank; gradients all-reduced in buckets, skipped on non-final micro steps."""

    @classmethod
    def refusal(cls, name: str, model: nn.Module, blocks: list[tuple[str, nn.Module]],
                unused: list[str] | None) -> str | None:
        # Its reducer waits for every trainable parameter's gradient: one the forward never uses stalls the step
        # ("Expected to have finished reduction in the prior iteration"). 0-dim parameters are fine.
        return unused_refusal(name, unused or [])

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.dp_size * self.cp == 1 or not self.trains:  # one replica, or forward only: nothing to all-reduce
            return model
        s = self.cfg.strategy
        # parallel.cp: the data-parallel x context-parallel ranks (train/strategies/mesh.py), else the world.
        group = self.layout.grad_mesh().get_group() if self.layout is not None else None
        if self.expert_parallel is not None:  # each rank holds other experts: reduced by expert_parallel.py
            # Under the names they have now (activation checkpointing's wrappers add a part to them).
            names = [n for n, p in model.named_parameters() if self.expert_parallel.owns(p)]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
        ddp = FixedBucketsDDP(
            model,
            process_group=group,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=s.bucket_cap_mb,
            gradient_as_bucket_view=s.gradient_as_bucket_view,
        )
        kind, _ = chosen(self.cfg, self.env)  # strategy.grad_compression: a hook on the buckets
        if kind != "none":
            self.compression = DDPCompression(kind, group, self.cfg)
            self.compression.register(ddp)
        return ddp

    @contextlib.contextmanager
    def accumulation(self, is_last_micro_step: bool) -> Iterator[None]:
        if is_last_micro_step or not isinstance(self.model, DistributedDataParallel):
            yield
        else:
            with self.model.no_sync():
                yield
