"""precision=fp8: the linear layers of our transformer's blocks as torchao Float8Linear (contract/rules/float8.py
says which, and what the launch checked). Applied before compile and before any strategy wraps the model, as
torchtitan converts before parallelising; with a tensorwise recipe under FSDP2 the converted weights are
all-gathered in float8, and their scales are computed for all of them at once after each optimizer step
(precompute_scales) instead of one small reduction per layer in the next forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError
from contract.rules import float8


def refusal_here(device: torch.device) -> str | None:
    """Why this rank's device can't run float8 matrix multiplies (the launch checked the cluster's GPU type; this
    is the GPU itself), or None."""
    if device.type != "cuda":
        return float8.gpu_refusal(None, None, f"this rank ({device.type})")
    return float8.gpu_refusal(None, torch.cuda.get_device_capability(device), f"this rank's GPU ({device})")


def _wanted(block_prefixes: tuple[str, ...], recipe: str, size_rule: bool) -> Any:
    def wanted(module: nn.Module, fqn: str) -> bool:
        # A mixture of experts' router stays out: it is computed in fp32 (train/model/moe.py). With the size rule
        # (precision.float8_filter=auto), so does a layer too small for float8 to pay: the plan names the same ones.
        return (isinstance(module, nn.Linear) and fqn.startswith(block_prefixes) and not fqn.endswith(".router")
                and module.in_features % float8.DIM_MULTIPLE == 0 and module.out_features % float8.DIM_MULTIPLE == 0
                and not (size_rule and float8.small_layer(module.in_features, module.out_features, recipe)))
    return wanted


def convert(model: nn.Module, cfg: Any, device: torch.device, emulate: bool = False) -> int:
    """Swap the blocks' linear layers for Float8Linear in place; returns how many. `emulate` (tests on CPU only):
    torchao's emulation, float8 rounding in high-precision matmuls, which needs no GPU."""
    reason = float8.config_refusal(cfg) or (None if emulate else refusal_here(device))
    if reason:
        raise ConfigError(reason)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:
        raise ConfigError("precision=fp8 needs torchao: run `pip install -e .[fp8]`") from err
    recipe = str(cfg.precision.get("float8_recipe", "tensorwise"))
    config = Float8LinearConfig.from_recipe_name(recipe)
    if float8.fp8_all_gather(cfg) or emulate:
        from dataclasses import replace

        config = replace(config, enable_fsdp_float8_all_gather=float8.fp8_all_gather(cfg), emulate=emulate)
    size_rule = str(cfg.precision.get("float8_filter", "auto")) == "auto"
    convert_to_float8_training(model, config=config, module_filter_fn=_wanted(("blocks.",), recipe, size_rule))
    from torchao.float8.float8_linear import Float8Linear

    return sum(isinstance(m, Float8Linear) for m in model.modules())


def precompute_scales(model: nn.Module) -> None:
    """After an optimizer step under FSDP2's float8 all-gather: every converted weight's scale in one pass."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
