"""Build the model a config names: ours (train/model/transformer.py), a user's `model._target_`, or a Hugging Face causal LM.

What the rest of training asks of any model: `model(inputs)` returns logits (a tensor, or an output with `.logits`
as Hugging Face models return), and, optionally, `model.flops_per_token(seq_len)` for MFU and the launch plan
(without it, 6 x parameters per token is assumed).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from contract.errors import ConfigError


class TargetError(ConfigError):
    """A `_target_` that can't be imported; the message names the fix."""


def resolve_target(key: str, target: str) -> Any:
    """The object a dotted path names (module.attr[.attr...]), importing the longest importable module prefix."""
    parts = target.split(".")
    if len(parts) < 2:
        raise TargetError(f"{key}={target} names no module: write it as module.{target} (the file or package that "
                          f"defines {target}, importable from this directory)")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # this prefix is not a module: try a shorter one
            raise TargetError(f"{key}={target}: importing {module_name} failed: {err}{_shadowed(err.name)}") from err
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise TargetError(f"{key}={target}: {module_name} has no {'.'.join(parts[cut:])}: check the name") from None
        return obj
    raise TargetError(f"{key}={target} can't be imported: run from the directory that holds "
                      f"{parts[0]}.py (or {parts[0]}/), or install it (pip install -e .)")


def _shadowed(missing: str | None) -> str:
    """Why `train.x` is missing when the user's project has a train/ of its own: the name is slurmtrain's package."""
    if missing is None or missing.split(".")[0] != "train" or missing == "train":
        return ""
    return ("; `train` is slurmtrain's own package (its compute side), which a train/ or train.py of your project can't "
            "replace: rename yours (e.g. to my_train/) and import it under that name")


def check_arguments(key: str, target: str, obj: Any, kwargs: dict[str, Any]) -> None:
    """A call that can't match the target's signature is the user's input (`*.args`), not a crash."""
    import inspect

    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return  # no signature to check against (a builtin): the call itself will tell
    try:
        signature.bind(**{k: v for k, v in kwargs.items() if not k.startswith("_")})
    except TypeError as err:
        section = key.rsplit(".", 1)[0]
        raise ConfigError(f"{key}={target} does not take these arguments ({err}): fix {section}.args "
                          f"(it takes {', '.join(signature.parameters) or 'none'})") from None


def instantiate(key: str, target: str, args: Any) -> Any:
    """Hydra's instantiate of `target` with `args` (nested `_target_`s included), with our import errors."""
    from hydra.utils import instantiate as hydra_instantiate

    obj = resolve_target(key, target)  # a clear error first; Hydra's would bury it in a chain
    kwargs: dict[str, Any] = dict(OmegaConf.to_container(args, resolve=True) if OmegaConf.is_config(args)  # type: ignore[arg-type]
                                  else args or {})
    check_arguments(key, target, obj, kwargs)
    return hydra_instantiate({"_target_": target, **kwargs}, _convert_="all")


def is_ours(model_cfg: Any) -> bool:
    return not model_cfg.get("_target_")


def build_model(model_cfg: Any) -> nn.Module:
    if is_ours(model_cfg):
        from train.model.transformer import build_model as build_ours

        return build_ours(model_cfg)
    model = instantiate("model._target_", model_cfg._target_, model_cfg.args)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={model_cfg._target_} returned a {type(model).__name__}, not a torch "
                        "nn.Module: point it at a function or class that builds the model")
    return model


def logits_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if logits is None:
        raise TypeError(f"the model returned a {type(output).__name__}: it must return logits (a tensor, or an "
                        "output with .logits)")
    return logits  # type: ignore[no-any-return]


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(model: nn.Module, model_cfg: Any, seq_len: int) -> tuple[float, str]:
    """Training FLOPs per token and where the figure comes from."""
    if is_ours(model_cfg):
        from contract.rules.flops import flops_per_token as ours

        return ours(model_cfg, seq_len), "model"
    own = getattr(model, "flops_per_token", None)
    if callable(own):
        return float(own(seq_len)), "model"
    return 6.0 * count_parameters(model), "6 x parameters"
