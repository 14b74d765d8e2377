"""One Strategy protocol, one module per backend. Nothing outside this package branches on a strategy's name.

    base.py               the protocol and the torch-native implementation the wrappers share
    single.py ddp.py fsdp.py deepspeed.py   the backends
    mesh.py               the device mesh: data x context x pipeline x tensor parallel
    tensor_parallel.py    Megatron's column / row split of the transformer (DTensor)
    pipeline.py           pipeline stages and their schedules
    context_parallel.py   every sequence split over parallel.cp ranks: head-tail chunks, their attention
    limits.py             what a backend can't shard (one-line refusals)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from contract.rules.strategy_names import REGISTRY

if TYPE_CHECKING:  # the registry itself stays importable on a login node, without torch
    from train.strategies.base import Strategy

# Strategies that shard model by model block (FSDP's units): they need the model's blocks found.
PER_BLOCK = ("fsdp", "fsdp_grad_op", "hsdp")


def needs_blocks(strategy_cfg: Any) -> str | None:
    """Why this strategy config needs the model's repeated blocks, or None when it can train a model without."""
    if getattr(strategy_cfg, "activation_checkpointing", False):
        return "strategy.activation_checkpointing=true recomputes per block"
    if compiles_blocks(strategy_cfg):
        return "strategy.compile=true compiles per block"
    if getattr(strategy_cfg, "name", None) in PER_BLOCK:
        return f"strategy={strategy_cfg.name} shards per block"
    return None


def compiles_blocks(strategy_cfg: Any) -> bool:
    """strategy.compile with strategy.compile_unit=blocks (a config.yaml from before the key: blocks)."""
    return bool(getattr(strategy_cfg, "compile", False)) and getattr(strategy_cfg, "compile_unit", "blocks") == "blocks"


def strategy_class(name: str) -> type[Strategy]:
    """The class of a registered strategy (its module is imported only now)."""
    module_name, _, class_name = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]


def build_strategy(cfg: Any, env: Any, device: Any) -> Strategy:
    """The strategy named by cfg.strategy.name."""
    return strategy_class(cfg.strategy.name)(cfg, env, device)


__all__ = ["PER_BLOCK", "REGISTRY", "build_strategy", "compiles_blocks", "needs_blocks", "strategy_class"]
