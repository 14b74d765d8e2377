"""Tensor parallelism on slurmtrain's transformer with DTensor (Megatron's pattern, as in TorchTitan).

Attention q, k, v and the MLP's gate and up are split by columns (heads, hidden units), the attention and MLP
output projections by rows; the norms run sequence-parallel (each rank normalises its slice of the sequence),
the embedding is split by vocabulary rows and hands on a sequence slice, the output layer is split by vocabulary
and gathered, so the loss sees whole logits on every tensor-parallel rank.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    tp = tp_mesh.size()
    root: dict[str, object] = {}
    if getattr(model, "embed", None) is not None:
        root["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if getattr(model, "lm_head", None) is not None:
        root["final_norm"] = SequenceParallel()
        root["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    if root:
        parallelize_module(model, tp_mesh, root)  # type: ignore[arg-type]
    for block in model.blocks.values():  # type: ignore[union-attr, operator]
        plan = {
            "attn_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.out": RowwiseParallel(output_layouts=Shard(1)),
            "mlp_norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
        }
        if block.mlp.gate is not None:
            plan["mlp.gate"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]
        block.attn.n_heads //= tp
        block.attn.n_kv_heads //= tp
