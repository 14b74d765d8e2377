"""A Hugging Face checkpoint's tensors under the names of the model they load into, as `from_pretrained` names them.

transformers 5 saves some architectures under other names than its modules' (`save_pretrained` writes the legacy
layout back): GPT-NeoX's head is `lm_head` in the model and `embed_out` in the file, Mixtral and Qwen2-MoE save each
expert's projections apart and hold them stacked, Granite-MoE's router is `router.layer` in the file. Loading maps
them back with its per-architecture conversion mapping (transformers/conversion_mapping.py) and its key renaming
(core_model_loading.rename_source_key: every renaming, then at most one converter that merges or splits tensors,
then the base model's prefix added or dropped). We take both from transformers rather than keep a table of our
own, and follow `convert_and_load_state_dict_in_model`'s steps; the launch check (the model on the meta device, the
files' headers as meta tensors) and the ranks' loading go through the same `Conversion`, so they see one set of
names. A model that is not a transformers model, or a transformers without a conversion mapping (4.x, which saves a
causal LM under its modules' names), reads every tensor under its saved name.

slurmtrain's own transformer takes a Llama or GPT-2 `save_pretrained` directory through its family's adapter in the
inverse direction (NativeConversion: train/weights/hf_adapters.py), the directory's config.json checked first: an
architecture or option ours does not compute is refused pointing at model=hf_causal_lm, and a value the weights'
shapes would not reveal (RoPE's theta, the norms' epsilon, tied or not) must be the model's.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError

Read = Callable[[str], torch.Tensor]  # a tensor of the files, by its saved name


def conversions(model: nn.Module) -> list[Any]:
    """The weight conversions `from_pretrained` applies for this model (its architecture's and transformers'
    legacy renamings); [] for any other model."""
    modeling = sys.modules.get("transformers.modeling_utils")  # a transformers model has imported it
    if modeling is None or not isinstance(model, modeling.PreTrainedModel):
        return []
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:  # transformers 4.x
        return []
    return list(get_model_conversion_mapping(model))


class Conversion:
    """Where each saved tensor goes in `model`: read as it is under a (re)name, or into a converter that makes one
    or more of the model's tensors from several saved ones. A saved name the model has no place for keeps the name
    transformers gives it (the check reports it as extra, as from_pretrained reports it as unexpected)."""

    def __init__(self, model: nn.Module, saved: Iterable[str]) -> None:
        self.model = model
        self.direct: dict[str, str] = {}  # name in the model (or transformers' name for an extra) -> saved name
        self.converted: dict[str, tuple[Any, list[tuple[str, str]]]] = {}  # first target -> (converter, sources)
        mapping = conversions(model)
        if not mapping:
            self.direct = {name: name for name in saved}
            return
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            dot_natural_key,
            rename_source_key,
        )

        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
        names = dict.fromkeys(model.state_dict(), True)
        prefix = getattr(model, "base_model_prefix", None)
        for key in sorted(saved, key=dot_natural_key):
            name, pattern = rename_source_key(key, renamings, converters, prefix, names)
            if name not in names and key in names:  # already the model's name: only the prefix may change
                name, pattern = rename_source_key(key, [], [], prefix, names)
            if pattern is not None and name in names:
                self.converted.setdefault(name, (by_pattern[pattern], []))[1].append((key, pattern))
            else:  # the first saved name wins a target two of them rename to, as in from_pretrained
                self.direct.setdefault(name, key)

    def tensors(self, read: Read, wanted: Callable[[str], bool] = lambda name: True
                ) -> Iterator[tuple[str, torch.Tensor, tuple[str, ...]]]:
        """(name in the model, its tensor, the saved names it is made of) for each tensor `wanted` asks for: a
        direct one read alone, a converter's sources read and converted together (its targets come out at once).
        With meta tensors for `read`, the names and shapes without reading anything."""
        for name, key in self.direct.items():
            if wanted(name):
                yield name, read(key), (key,)
        for first, (converter, sources) in self.converted.items():
            convert = deepcopy(converter)  # each target group its own collected tensors, as in from_pretrained
            for key, pattern in sources:
                convert.add_tensor(first, key, pattern, lambda key=key: read(key))
            keys = tuple(key for key, _ in sources)
            try:
                made = convert.convert(first, model=self.model, config=getattr(self.model, "config", None))
            except Exception as err:  # noqa: BLE001 - one clause naming what could not be converted
                why = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
                more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
                raise ConversionFailed(f"transformers could not convert {keys[0]}{more} into {first} "
                                       f"({type(err).__name__}: {why})") from None
            for target, value in made.items():
                if wanted(target):
                    yield target, value[0] if isinstance(value, list) else value, keys


class ConversionFailed(ValueError):
    """A converter refused the saved tensors (their number or shapes are not what the architecture saves)."""


# Model keys a Hugging Face config.json sets that the weights' shapes do not show (theirs are the fit check's).
UNSEEN = ("position", "mlp", "norm", "n_heads", "n_kv_heads", "rope_theta", "norm_eps", "tie_embeddings")


def _ours(model_cfg: Any, key: str) -> Any:
    value = model_cfg.get(key) if hasattr(model_cfg, "get") else getattr(model_cfg, key, None)
    if key == "n_kv_heads":
        return value or _ours(model_cfg, "n_heads")
    return 1e-5 if key == "norm_eps" and value is None else value


def disagreement(model_cfg: Any, keys: Mapping[str, Any]) -> str | None:
    """The first value of a config.json (as model keys) that the model sets otherwise, unseen in the shapes."""
    for key in (k for k in UNSEEN if k in keys):
        theirs = _ours(keys, key)
        ours = _ours(model_cfg, key)
        if ours != theirs and not (isinstance(ours, float) and abs(ours - theirs) <= 1e-9 * abs(theirs)):
            return f"its config.json has {key}={theirs} and the model model.{key}={ours}: set model.{key}={theirs}"
    return None


class NativeConversion:
    """A Llama or GPT-2 checkpoint's tensors under our transformer's names: the same interface as Conversion."""

    def __init__(self, model_cfg: Any, saved: Iterable[str], config_json: Path, named: str) -> None:
        from contract.rules.hf_native import native_model_keys
        from train.weights.hf_adapters import adapter, with_prefix

        config = json.loads(config_json.read_text())
        self.keys = native_model_keys(config, str(config_json.parent))
        problem = disagreement(model_cfg, self.keys)
        if problem:
            raise ConfigError(f"{named} does not fit the model: {problem}")
        self.adapter = adapter(self.keys)
        ignored = [re.compile(p) for p in self.adapter.ignored]
        self.folder = config_json.parent
        self.names = {with_prefix(self.adapter, k): k for k in saved if not any(p.search(k) for p in ignored)}
        self.sources = self.adapter.from_hf(self.names)
        self.zero = self.adapter.zero(self.names)

    def tensors(self, read: Read, wanted: Callable[[str], bool] = lambda name: True
                ) -> Iterator[tuple[str, torch.Tensor, tuple[str, ...]]]:
        for name, source in self.sources.items():
            if wanted(name):
                keys = tuple(self.names[k] for k in source.saved)
                yield name, source.make([read(k) for k in keys]), keys

    def refuse_nonzero(self, read: Read, named: str) -> None:
        """Saved tensors our model has no place for (GPT-2's biases) load only when they are all zero."""
        for key in self.zero:
            if bool(read(self.names[key]).any()):
                raise ConfigError(f"{named} holds {self.names[key]}, a bias that is not zero, which slurmtrain's "
                                  "transformer (Linear layers without biases) does not compute: train it as it is "
                                  f"with model=hf_causal_lm model.config_path={self.folder}")
