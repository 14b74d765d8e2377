"""Which strategy settings work per model block, the model's repeated layer (train/model/blocks.py finds them):
FSDP's sharding units, activation checkpointing and torch.compile of each block. Pure; no torch."""

from __future__ import annotations

from typing import Any

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
