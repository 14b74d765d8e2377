"""One Strategy protocol, one module per backend. Nothing outside this package branches on a strategy's name.

    base.py               the protocol and the torch-native implementation the wrappers share
    single.py ddp.py fsdp.py deepspeed.py   the backends
    mesh.py               the device mesh: data x context x pipeline x tensor parallel
    tensor_parallel.py    Megatron's column / row split of the transformer (DTensor); MoE layers whole per tp rank
    pipeline.py           pipeline stages and their schedules
    context_parallel.py   every sequence split over parallel.cp ranks: head-tail chunks, their attention
    expert_parallel.py    parallel.ep: each MoE layer's experts over data-parallel ranks, tokens by all-to-all
    expert_stages.py      parallel.ep under parallel.pp or tp: the ep groups of one stage's / tp index's data ranks
    grads.py              gradients on several meshes: their global norm; a flat all-reduce over a group
    limits.py             what a backend can't shard (one-line refusals)
    grad_compression.py   strategy.grad_compression: DDP's communication hook (bf16, fp16, PowerSGD and its per-rank
                          state, checkpointed), FSDP2's reduce dtype
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from contract.rules.per_block import PER_BLOCK, compiles_blocks, needs_blocks
from contract.rules.strategy_names import REGISTRY

if TYPE_CHECKING:  # the registry itself stays importable on a login node, without torch
    from train.strategies.base import Strategy

def strategy_class(name: str) -> type[Strategy]:
    """The class of a registered strategy (its module is imported only now)."""
    module_name, _, class_name = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]


def build_strategy(cfg: Any, env: Any, device: Any) -> Strategy:
    """The strategy named by cfg.strategy.name."""
    return strategy_class(cfg.strategy.name)(cfg, env, device)


__all__ = ["PER_BLOCK", "REGISTRY", "build_strategy", "compiles_blocks", "needs_blocks", "strategy_class"]
