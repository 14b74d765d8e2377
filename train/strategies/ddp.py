from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.strategies.base import Strategy
from train.strategies.limits import unused_refusal


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
        return DistributedDataParallel(
            model,
            process_group=group,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=s.bucket_cap_mb,
            gradient_as_bucket_view=s.gradient_as_bucket_view,
        )

    @contextlib.contextmanager
    def accumulation(self, is_last_micro_step: bool) -> Iterator[None]:
        if is_last_micro_step or not isinstance(self.model, DistributedDataParallel):
            yield
        else:
            with self.model.no_sync():
                yield
