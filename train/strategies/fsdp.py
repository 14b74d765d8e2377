"""FSDP2 (fully_shard): fsdp (ZeRO-3 layout), fsdp_grad_op (ZeRO-2 layout) and hsdp (2-D mesh).

A 0-dim parameter (a learned scale or temperature) has no dimension to shard: FSDP leaves it whole on every rank
(`ignored_params`), under its own name and shape in checkpoints and exports, and its gradient is averaged over the
data-parallel ranks here, before clipping, as FSDP averages the sharded ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from train.observe import quiet
from train.strategies.base import Strategy
from train.strategies.grad_compression import reduce_dtype
from train.strategies.limits import dtype_refusal, scalar_parameters


class FSDPStrategy(Strategy):
    """Each block (train/model/blocks.py) is its own FSDP unit, then the root (embeddings, final norm, head)."""

    # 0-dim parameters, replicated rather than sharded (set by wrap).
    replicated: list[nn.Parameter] = []

    @classmethod
    def refusal(cls, name: str, model: nn.Module, blocks: list[tuple[str, nn.Module]],
                unused: list[str] | None) -> str | None:
        # An FSDP unit all-gathers its parameters as one flat buffer of one dtype (0-dim ones stay out of it).
        in_blocks: set[int] = set()
        for block_name, block in blocks:
            params = [(f"{block_name}.{n}", p) for n, p in block.named_parameters() if p.dim()]
            in_blocks.update(id(p) for _, p in params)
            reason = dtype_refusal(name, f"each block ({block_name})", params, "strategy=ddp")
            if reason:
                return reason
        root = [(n, p) for n, p in model.named_parameters() if p.dim() and id(p) not in in_blocks]
        return dtype_refusal(name, "the model outside its blocks", root, "strategy=ddp")

    def mesh(self) -> DeviceMesh:
        if self.layout is not None:  # tensor / pipeline / context parallel: shard over data (x context) parallel
            return self.layout.grad_mesh()  # type: ignore[no-any-return]
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
        quiet.fsdp_notices()
        mesh = self.replica_mesh = self.mesh()
        self.dp_groups, self.dp_ranks = [mesh.get_group(dim) for dim in range(mesh.ndim)], mesh.size()
        reshard = bool(self.cfg.strategy.reshard_after_forward)
        self.replicated = [p for _, p in scalar_parameters(model)]
        # Passed only when there are some: older torch has no ignored_params.
        # parallel.ep: the expert parameters stay this rank's experts, whole (train/strategies/expert_parallel.py).
        experts = self.expert_parallel.params if self.expert_parallel is not None else []
        options: dict[str, Any] = ({"ignored_params": set(self.replicated) | set(experts)}
                                   if self.replicated or experts else {})
        dtype = reduce_dtype(self.cfg, self.env)  # strategy.grad_compression=bf16/fp16: FSDP2 reduces in it
        if dtype is not None:
            options["mp_policy"] = MixedPrecisionPolicy(reduce_dtype=dtype)
        for block in self.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, **options)
        # The root keeps its parameters after forward: backward needs them at once (tied embedding/head). An
        # interleaved pipeline runs views of the model, one per stage: each is a root of its own.
        for root in [p for p in self.parts if p is not model] or [model]:
            fully_shard(root, mesh=mesh, reshard_after_forward=False, **options)
        return model

    def replica_set(self) -> tuple[tuple[int, ...], list[tuple[str, torch.Tensor]]]:
        """HSDP: the replicas hold the same local shards across the replicate dimension. Plain FSDP shards share only
        the replicated 0-dim parameters."""
        key, named = super().replica_set()
        names = self.replica_mesh.mesh_dim_names or ()
        if not any("replicate" in n for n in names):
            own = {id(p) for p in self.replicated}
            if self.expert_parallel is not None and self.expert_parallel.edp > 1:  # whole, held by the edp group
                own |= {id(p) for p in self.expert_parallel.params}
            return key, [(n, p) for n, p in named if id(p) in own]
        return key + (self.replica_mesh.get_local_rank(names[-1]),), named

    def replica_note(self) -> str:
        names = self.replica_mesh.mesh_dim_names or ()
        if any("replicate" in n for n in names):  # hsdp whose replicate dimension is 1 on this layout
            return (f"strategy={self.name} has a single replica here (strategy.replicate_degree, by default one per "
                    "node, is 1): every shard is held once")
        return (f"strategy={self.name} shards every parameter over the data-parallel ranks and the model has no "
                "replicated (0-dim) parameters" + ("" if self.name == "hsdp" else
                                                  "; strategy=hsdp compares its replicas' shards"))

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        if not self.replicated:
            return super().clip_gradients(max_norm)
        assert self.model is not None
        replicated = [p.grad for p in self.replicated if p.grad is not None]
        if replicated:  # one all-reduce for all of them: the mean over the data-parallel ranks
            flat = torch.stack([g.reshape(()) for g in replicated])
            for group in self.dp_groups:
                dist.all_reduce(flat, group=group)
            torch._foreach_copy_(replicated, list((flat / self.dp_ranks).unbind()))
        own = {id(p) for p in self.replicated}
        sharded = [p.grad for p in self.model.parameters() if p.grad is not None and id(p) not in own]
        norm = torch.nn.utils.get_total_norm(sharded)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        norm = torch.linalg.vector_norm(torch.stack([norm, torch.nn.utils.get_total_norm(replicated).to(norm)]))
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        # The sharded gradients' local shards, scaled in place (a plain tensor can't scale a DTensor).
        local = [g.to_local() if isinstance(g, DTensor) else g for g in sharded + replicated]
        torch._foreach_mul_(local, coefficient)
        return norm

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
