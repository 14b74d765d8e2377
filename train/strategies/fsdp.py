"""FSDP2 (fully_shard): fsdp (ZeRO-3 layout), fsdp_grad_op (ZeRO-2 layout) and hsdp (2-D mesh)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from train.strategies.base import Strategy


class FSDPStrategy(Strategy):
    """Each block (train/blocks.py) is its own FSDP unit, then the root (embeddings, final norm, head)."""

    def mesh(self) -> DeviceMesh:
        if self.layout is not None:  # tensor / pipeline parallel: shard over the data-parallel dimensions
            return self.layout.dp_mesh()  # type: ignore[no-any-return]
        world = self.env.world_size
        if self.name != "hsdp":
            return init_device_mesh(self.device.type, (world,), mesh_dim_names=("shard",))
        nodes = max(1, world // max(1, self.env.local_world_size))
        replicate = self.cfg.strategy.replicate_degree or nodes
        if world % replicate:
            raise ValueError(f"strategy.replicate_degree={replicate} does not divide the world size {world}")
        return init_device_mesh(self.device.type, (replicate, world // replicate),
                                mesh_dim_names=("replicate", "shard"))

    def wrap(self, model: nn.Module) -> nn.Module:
        mesh = self.mesh()
        reshard = bool(self.cfg.strategy.reshard_after_forward)
        for block in self.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        # The root keeps its parameters after forward: backward needs them at once (tied embedding/head). An
        # interleaved pipeline runs views of the model, one per stage: each is a root of its own.
        for root in [p for p in self.parts if p is not model] or [model]:
            fully_shard(root, mesh=mesh, reshard_after_forward=False)
        return model

    def make_scaler(self) -> Any:
        # Each rank sees only its gradient shard: the sharded scaler agrees on overflow across ranks.
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=self.device.type)

    @contextlib.contextmanager
    def accumulation(self, is_last_micro_step: bool) -> Iterator[None]:
        assert self.model is not None
        # No reduce-scatter on the non-final micro steps: gradients accumulate locally, one sync per step.
        self.model.set_requires_gradient_sync(is_last_micro_step)  # type: ignore[operator]
        yield
