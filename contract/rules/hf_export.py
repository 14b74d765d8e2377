"""Which runs export as a Hugging Face model: one rule for `python -m launcher.export --format hf` (before the
checkpoint is read), checkpoint.export_hf=true (at launch, before anything runs) and the launch plan's warning for a
model that will not export (a run of hours should not find out at its end)."""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError
from contract.rules.hf_config import HF_TARGET
from contract.rules.hf_native import family


def refuse_unexportable(model: Any, asked: str, instead: str) -> None:
    """ConfigError (one line: `asked` says who asked, `instead` the way out) unless the model is model=hf_causal_lm
    or slurmtrain's transformer as a Hugging Face class computes it exactly (contract/rules/hf_native.py)."""
    target = model.get("_target_")
    if target == HF_TARGET:
        return
    if target:
        raise ConfigError(f"{asked} takes slurmtrain's transformer or model=hf_causal_lm, and this run's model is "
                          f"model._target_={target}: {instead}")
    try:
        family(model)
    except ConfigError as err:
        raise ConfigError(f"{asked}: {err}; {instead}") from None


def export_warning(model: Any) -> str | None:
    """The launch plan's line for slurmtrain's transformer in a shape no Hugging Face class computes; None for one
    that exports, and for a model of the user's own (never exported as Hugging Face, which they know)."""
    if model.get("_target_"):
        return None
    try:
        family(model)
    except ConfigError as err:
        return f"warning: launcher.export --format hf will refuse this model ({err}); --format safetensors exports it"
    return None
