"""Tensor parallelism on slurmtrain's transformer with DTensor (Megatron's pattern, as in TorchTitan).

Attention q, k, v and the MLP's gate and up are split by columns (heads, hidden units), the attention and MLP
output projections by rows; the norms run sequence-parallel (each rank normalises its slice of the sequence),
the embedding is split by vocabulary rows and hands on a sequence slice, the output layer is split by vocabulary
and gathered, so the loss sees whole logits on every tensor-parallel rank.

A mixture-of-experts layer (train/model/moe.py) is not split: it runs on the rank's slice of the sequence, as the
sequence-parallel norm hands it on (no communication in or out), with its router, experts and shared experts whole
on every tp rank. Each rank's gradient of them is its tokens' share, so the strategy sums them over the tp group
before clipping (`sum_replicated_gradients`); under parallel.ep the experts are split over the data-parallel ranks
of one tp index (train/strategies/expert_stages.py), as Megatron-Core's and torchtitan's expert layouts take ep from
the data-parallel ranks.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from train.model.moe import MoE, SequenceSlice
from train.strategies.grads import all_reduce_flat


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
        plan: dict[str, Any] = {
            "attn_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.out": RowwiseParallel(output_layouts=Shard(1)),
            "mlp_norm": SequenceParallel(),
        }
        if isinstance(block.mlp, MoE):  # on the rank's sequence slice, whole weights (the docstring)
            # The norm's DTensor in, its local slice to the layer; out a local slice, as the residual stream is.
            plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                             use_local_output=True)
            block.mlp.tp_slice = SequenceSlice(tp_mesh.get_group())
        else:
            plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan["mlp.up"] = ColwiseParallel()
            plan["mlp.down"] = RowwiseParallel(output_layouts=Shard(1))
            if block.mlp.gate is not None:
                plan["mlp.gate"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]
        block.attn.n_heads //= tp
        block.attn.n_kv_heads //= tp


def tp_replicated(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every tp rank holds whole and trains on its own tokens: the MoE layers' (look them up after
    wrapping, which replaces FSDP's parameters)."""
    return [p for m in model.modules() if isinstance(m, MoE) and m.tp_slice is not None for p in m.parameters()]


def sum_replicated_gradients(params: list[nn.Parameter], group: Any) -> None:
    """Each tp rank's gradients of `params` hold its tokens' share: summed over the tp group (one all-reduce), they
    are the whole micro batches' on every tp rank. FSDP's shards are summed through their local tensors (the same
    shard on each tp rank of a data-parallel index)."""
    grads = [p.grad for p in params if p.grad is not None]
    all_reduce_flat([g.to_local() if isinstance(g, DTensor) else g for g in grads], group)

