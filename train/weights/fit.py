"""Do model.init_from's weights fit the model: the shapes found in the files (DCP, DeepSpeed, safetensors,
torch files; Hugging Face names converted as from_pretrained does, or a Llama / GPT-2 directory's into
slurmtrain's transformer) against the model's, each tensor's source, and the first difference named with its fix.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError
from contract.rules.init_source import KEY, MODEL_DIR, RESUME_KEY, InitSource, hf_config_json
from train.weights.export import MODEL_PREFIX, clean_key, tie_groups
from train.weights.files import tensor_reader, tensor_shapes
from train.weights.hf_conversion import Conversion, ConversionFailed, NativeConversion

Shapes = dict[str, tuple[int, ...]]


# -- what the weights hold -------------------------------------------------------------------------------------
def dcp_keys(step_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{model name: (the key DCP stored it under, its full shape)} of a DCP checkpoint, from its metadata only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(step_dir / MODEL_DIR)).read_metadata().state_dict_metadata
    return {clean_key(k[len(MODEL_PREFIX):]): (k, tuple(m.size)) for k, m in metadata.items()
            if k.startswith(MODEL_PREFIX) and isinstance(m, TensorStorageMetadata)}


def _deepspeed_shapes(step_dir: Path) -> Shapes:
    """The parameters' and buffers' shapes DeepSpeed records in its model states file (no weights loaded)."""
    files = sorted((step_dir / MODEL_DIR).glob("*model_states.pt"))
    return _model_states_shapes(torch.load(files[0], map_location="meta", weights_only=False))


def _model_states_shapes(state: dict[str, Any]) -> Shapes:
    shapes: Shapes = {}
    for group in state.get("param_shapes") or []:
        shapes.update({clean_key(name): tuple(shape) for name, shape in group.items()})
    for name in state.get("buffer_names") or []:
        tensor = (state.get("module") or {}).get(name)
        if tensor is not None:
            shapes[clean_key(name)] = tuple(tensor.shape)
    return shapes


@dataclass(frozen=True)
class Found:
    """What the weights hold under the model's names: each tensor's shape and the saved tensors it is made of
    (itself, but for a Hugging Face checkpoint converted as from_pretrained converts it: train/weights/hf_conversion.py)."""
    shapes: Shapes
    saved: dict[str, tuple[str, ...]]
    conversion: Conversion | NativeConversion | None = None  # weight files: how saved tensors become the model's

    def count(self, names: Iterable[str | None]) -> int:
        """How many saved tensors these names are read from."""
        return len({key for name in names if name is not None for key in self.saved[name]})


def _as_found(shapes: Shapes) -> Found:
    return Found(shapes, {name: (name,) for name in shapes})


def _file_shapes(src: InitSource) -> Shapes:
    try:
        return tensor_shapes(list(src.files))
    except Exception as err:  # noqa: BLE001 - a file that is not weights: one line
        raise ConfigError(f"{KEY}={src.path} could not be read as weights ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:120] if str(err) else ''}): point it at a safetensors or torch "
                          "weights file, a Hugging Face model directory or a run's checkpoint") from None


def found_in(src: InitSource, model: nn.Module) -> Found:
    """The weights' names (the model's, for weight files) and shapes, from headers and metadata: nothing read.
    ConversionFailed when transformers can't convert a Hugging Face checkpoint's tensors for this model."""
    if src.kind == "dcp":
        return _as_found({name: shape for name, (_, shape) in dcp_keys(src.path).items()})
    if src.kind == "deepspeed":
        return _as_found(_deepspeed_shapes(src.path))
    saved = _file_shapes(src)
    config_json = hf_config_json(src)
    conversion: Conversion | NativeConversion
    if config_json is not None and _native(model):
        conversion = NativeConversion(model.cfg, saved, config_json, src.named())
        conversion.refuse_nonzero(tensor_reader(src.files), src.named())
    else:
        conversion = Conversion(model, saved)
    shapes: Shapes = {}
    origins: dict[str, tuple[str, ...]] = {}
    for name, tensor, keys in conversion.tensors(lambda key: torch.empty(saved[key], device="meta")):
        shapes[name], origins[name] = tuple(tensor.shape), keys
    return Found(shapes, origins, conversion)


def _native(model: nn.Module) -> bool:
    """slurmtrain's own transformer (which takes a Llama or GPT-2 directory through its family's adapter)."""
    from train.model.transformer import Transformer

    return isinstance(model, Transformer)


# -- do they fit the model -------------------------------------------------------------------------------------
def model_shapes(model: nn.Module) -> Shapes:
    return {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}


def _ignored(model: nn.Module) -> list[re.Pattern[str]]:
    """Names a Hugging Face model says its saved weights may hold and it does not (old rotary buffers)."""
    return [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]


def sources_for(expected: Shapes, groups: list[list[str]], found: Shapes) -> dict[str, str | None]:
    """{model name: the name it is read from}: itself, or a tied name the weights hold (a tied output layer is
    saved once), or None when the weights hold neither."""
    tied = {name: group for group in groups for name in group}
    out: dict[str, str | None] = {}
    for name in expected:
        candidates = [name, *(n for n in tied.get(name, []) if n != name)]
        out[name] = next((n for n in candidates if n in found), None)
    return out


def first_problem(expected: Shapes, groups: list[list[str]], found: Shapes,
                  ignored: list[re.Pattern[str]] | None = None) -> str | None:
    """The first parameter (in the model's order) the weights lack or hold in another shape, else the first
    tensor they hold that the model has not, as one clause; None when they fit."""
    for name, source in sources_for(expected, groups, found).items():
        if source is None:
            near = difflib.get_close_matches(name, list(found), n=1, cutoff=0.6)
            hint = f" (the nearest name there is {near[0]})" if near else f" (they hold {len(found)} tensors"
            hint += "" if near else (f", the first {next(iter(found))})" if found else ")")
            return f"the weights have no {name}{hint}"
        if found[source] != expected[name]:
            return (f"{name} is {list(expected[name])} in the model but {list(found[source])} in the weights")
    extra = [n for n in found if n not in expected and not any(p.search(n) for p in ignored or [])]
    if extra:
        return f"the weights hold {extra[0]}, which the model has not" + (
            f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
    return None


def _model_differences(src: InitSource, model_cfg: Any) -> list[str]:
    """model.* keys the checkpoint's run was trained with that this config sets otherwise."""
    from omegaconf import OmegaConf

    saved_file = src.path / "config.yaml"
    if model_cfg is None or not saved_file.is_file():
        return []
    try:
        saved: Any = OmegaConf.to_container(OmegaConf.load(saved_file).model, resolve=True)
    except Exception:  # noqa: BLE001 - no hint then
        return []
    ours = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else dict(model_cfg)
    assert isinstance(saved, dict) and isinstance(ours, dict)
    keys = [k for k in saved if k not in ("init_from",) and saved.get(k) != ours.get(k)]
    if "name" in keys:
        return [f"model={saved['name']}"] + [f"model.{k}={saved[k]}" for k in keys if k != "name"][:3]
    return [f"model.{k}={json.dumps(saved[k]) if isinstance(saved[k], (dict, list)) else saved[k]}"
            for k in keys[:4]]


def fix_for(src: InitSource, model_cfg: Any) -> str:
    """How to make the weights and the model agree, as specific as the source allows."""
    if src.key == RESUME_KEY:  # the run's code changed since the checkpoint was written (launcher/plan/code_change.py)
        return ("the code has changed since the checkpoint was written and builds another model: resume with the code "
                "that trained it, "
                "or start a new run (another run.name; model.init_from=RUN/checkpoints/step_N starts from its "
                "weights if they fit)")
    if src.key != KEY:  # a run's own checkpoint, built from its own config: the model's code changed since
        return ("the model its config.yaml builds has changed since the checkpoint was written: evaluate it with the "
                "slurmtrain version that trained it")
    if src.checkpoint:
        differences = _model_differences(src, model_cfg)
        if differences:
            return (f"that checkpoint was trained with {' '.join(differences)}: set the same, or point {KEY} at "
                    "weights of this model")
    folder = src.path if src.path.is_dir() else src.path.parent
    config = folder / "config.json"
    native = _native_differences(config, model_cfg)
    if native:
        return f"its config.json describes {' '.join(native)}: set the same"
    if config.is_file() and model_cfg is not None and model_cfg.get("config_path") != str(config):
        return f"build the model they were saved with: model=hf_causal_lm model.config_path={folder}"
    return f"build the model these weights were saved from, or point {KEY} at weights of this model"


def _native_differences(config: Path, model_cfg: Any) -> list[str]:
    """model.* values a Llama / GPT-2 config.json gives slurmtrain's transformer that this config sets otherwise
    (the first four); [] for any other config or model."""
    from contract.rules.hf_native import native_model_keys

    if model_cfg is None or model_cfg.get("_target_") or not config.is_file():
        return []
    try:
        keys = native_model_keys(json.loads(config.read_text()), str(config.parent))
    except (ConfigError, OSError, ValueError):
        return []
    return [f"model.{k}={v}" for k, v in keys.items() if v is not None and model_cfg.get(k) != v][:4]


def _checked(model: nn.Module, src: InitSource, model_cfg: Any) -> tuple[Found, dict[str, str | None]]:
    """What the weights hold and {model name: the name it is read from}; ConfigError naming the first parameter
    that does not fit."""
    expected, groups = model_shapes(model), tie_groups(model)
    try:
        found = found_in(src, model)
    except ConversionFailed as err:
        raise ConfigError(f"{src.named()} does not fit the model: {err}: {fix_for(src, model_cfg)}") from None
    problem = first_problem(expected, groups, found.shapes, _ignored(model))
    if problem:
        raise ConfigError(f"{src.named()} does not fit the model: {problem}: {fix_for(src, model_cfg)}")
    return found, sources_for(expected, groups, found.shapes)


def check_fit(model: nn.Module, src: InitSource, model_cfg: Any) -> int:
    """How many saved tensors the weights give the model; ConfigError naming the first parameter that does not
    fit."""
    found, plan = _checked(model, src, model_cfg)
    return found.count(plan.values())
