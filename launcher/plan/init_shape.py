"""The architecture comes with the weights: with `model.init_from` of a run, a checkpoint or a Hugging Face
directory, the model's shape keys (contract/rules/model_shape.py) are the source's, read from the config the weights
were trained with (the checkpoint's config.yaml, else its run's) or from config.json (a Llama or GPT-2, mapped by
contract/rules/hf_native.py). A shape key typed on the command line that disagrees is refused, naming both values.

A model group typed on the command line (`model=gpt2_124m`) chooses a whole architecture: each of its shape keys
counts as typed, so a group that disagrees with the weights is refused too, naming the group; the default group
(`tiny`, chosen by conf/config.yaml, not by the command) yields to the source, and the model is named as the source
was. A resumed run takes its shape from its own config.yaml (model.init_from is not read again: it may be gone).
`model=hf_causal_lm` takes model.config_path from the weights' config.json when none is typed; a run of a model
built by `_target_` brings its build keys when the command chooses no model. The plan's `shape:` line says where
the shape came from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import ConfigError
from contract.rules.hf_config import HF_TARGET, read_hf_config
from contract.rules.hf_native import native_model_keys
from contract.rules.init_source import KEY, WHAT_IT_TAKES, hf_config_json, resolve, trained_config
from contract.rules.model_shape import OLD_DEFAULTS, SHAPE_KEYS, describe, effective, has, matters, value_of
from contract.rundir import ckpt_layout as layout
from launcher.checks.overrides import typed_exactly, typed_for
from launcher.plan.init_from import refuse_inside_overwritten

# A model built by `_target_`: what builds it, taken together from a run that trained one.
BUILD_KEYS = ("_target_", "args", "config_path", "block", "vocab_size", "max_seq_len")


@dataclass(frozen=True)
class Source:
    model: dict[str, Any]  # the model keys the weights were trained with
    where: Path  # the config.yaml or config.json they come from
    name: str  # the model.name they trained as (a config.json: its model_type)
    resumed: bool = False  # the run's own config.yaml, resumed


@functools.lru_cache(maxsize=32)
def _model_section(path: str, stamp: tuple[int, int]) -> dict[str, Any] | None:
    """The model section of a saved config.yaml (read once per version of the file: a sweep's points share it)."""
    try:
        model: Any = OmegaConf.to_container(OmegaConf.load(path).model, resolve=True)
    except Exception:  # noqa: BLE001 - a damaged file brings no shape; the checks that need it say why
        return None
    return model if isinstance(model, dict) else None


def _saved_model(path: Path) -> dict[str, Any] | None:
    stat = path.stat()
    return _model_section(str(path), (stat.st_mtime_ns, stat.st_size))


def _resumed(cfg: DictConfig) -> Source | None:
    """A run named by run.name that resumes: its own config.yaml (the derived name is known only later, and
    hashes the shape taken from model.init_from, so the same command finds the same run)."""
    if not cfg.run.get("name") or not cfg.run.resume or cfg.run.overwrite:
        return None
    run_dir = Path(str(cfg.run.root)).expanduser().resolve() / str(cfg.run.name)
    saved = run_dir / "config.yaml"
    if layout.latest_complete_checkpoint(run_dir) is None or not saved.is_file():
        return None
    model = _saved_model(saved)
    return None if model is None else Source(model, saved, str(model.get("name") or ""), resumed=True)


def source_of(cfg: DictConfig) -> Source | None:
    """Where the shape comes from: the resumed run, or the config model.init_from's weights were trained with;
    None for weights that carry none."""
    resumed = _resumed(cfg)
    if resumed is not None:
        return resumed
    init = str(cfg.model.init_from)
    if not cfg.run.get("name") and not Path(init).exists():
        # The derived run name hashes the shape, so only a named run can be found (and resumed) without the source.
        raise ConfigError(f"{KEY}={init} does not exist: point it at {WHAT_IT_TAKES}; to resume a run started from "
                          "it, name that run (run.name=NAME): its own config.yaml then gives the shape")
    src = resolve(init)  # a missing path, a run without a checkpoint: refused as the plan does
    saved = trained_config(src)
    if saved is not None:
        model = _saved_model(saved)
        return None if model is None else Source(model, saved, str(model.get("name") or ""))
    config_json = hf_config_json(src)
    data = _hf_config(config_json) if config_json is not None else None
    if config_json is None or data is None:
        return None
    if cfg.model.get("_target_"):  # a Hugging Face model or a user's: config.json is its own, not mapped
        return Source({"config_path": str(config_json), "_target_": HF_TARGET}, config_json, str(data["model_type"]))
    return Source(native_model_keys(data, str(config_json.parent)), config_json, str(data["model_type"]))


def _hf_config(path: Path) -> dict[str, Any] | None:
    """A Hugging Face config.json beside the weights; None for another file of that name (no model_type) or one
    that can't be read (the weights then carry no config of their shape, and the plan says so)."""
    try:
        return read_hf_config(str(path))
    except ConfigError:
        return None


def _values(model: Any, keys: list[str], most: int = 99) -> str:
    shown = " ".join(f"model.{k}={value_of(model, k, OLD_DEFAULTS.get(k))}" for k in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _origin(source: Source) -> str:
    return "the run's own config.yaml, which it resumes" if source.resumed else str(source.where)


def _refuse(subject: str, drop: str, keys: list[str], cfg: DictConfig, source: Source) -> ConfigError:
    verb = "disagree" if len(keys) > 1 and subject == drop else "disagrees"
    return ConfigError(f"{subject} {verb} with {KEY}={cfg.model.init_from}: its weights were trained with "
                       f"{_values(source.model, keys, 4)} ({_origin(source)}): drop {drop} (the shape comes with the "
                       f"weights), or point {KEY} at weights of that shape")


def _adopt_native(cfg: DictConfig, source: Source) -> str:
    m = cfg.model
    group = typed_exactly("model")
    typed_keys: list[str] = []
    group_keys: list[str] = []
    adopted: dict[str, Any] = {}
    for key in SHAPE_KEYS:
        if not has(source.model, key) and key not in OLD_DEFAULTS:
            continue
        typed = typed_for(f"model.{key}")
        if typed is None and group is None:
            adopted[key] = value_of(source.model, key, OLD_DEFAULTS.get(key))
        elif matters(key, source.model) and effective(key, m) != effective(key, source.model):
            (typed_keys if typed is not None else group_keys).append(key)
    if typed_keys:
        typed = " ".join(str(typed_for(f"model.{k}")) for k in typed_keys)
        raise _refuse(typed, typed, typed_keys, cfg, source)
    if group_keys:
        raise _refuse(f"{group} (its {_values(m, group_keys, 4)})", str(group), group_keys, cfg, source)
    with open_dict(cfg):
        for key, value in adopted.items():
            OmegaConf.update(m, key, value, merge=True)
        if group is None and source.name:
            m.name = source.name
    head = f"{group}, as {_origin(source)} has it" if group is not None else f"from {_origin(source)}"
    line = f"shape: {head} ({describe(OmegaConf.to_container(m, resolve=True))})"  # type: ignore[arg-type]
    context = source.model.get("max_seq_len")
    if context is not None and m.max_seq_len != context:
        line += f"; context {m.max_seq_len} as typed (the weights were trained at {context})"
    return line


def _adopt_build(cfg: DictConfig, source: Source) -> str:
    """A model built by `_target_`: model=hf_causal_lm without model.config_path takes the weights' config.json
    (or the source run's); a command that chooses no model takes a run's whole build."""
    m = cfg.model
    if m.get("_target_") == HF_TARGET and not m.get("config_path") and source.model.get("config_path"):
        with open_dict(cfg):
            m.config_path = str(source.model["config_path"])
        return f"shape: model.config_path={m.config_path} (from {KEY}'s {source.where.name})"
    typed_build = [k for k in ("_target_", "args", "config_path") if typed_for(f"model.{k}") is not None]
    if m.get("_target_") or typed_exactly("model") is not None or typed_build:
        return f"shape: model={m.name} as composed (built by its own code; the weights are compared with it at launch)"
    with open_dict(cfg):
        for key in BUILD_KEYS:
            if key in source.model and typed_for(f"model.{key}") is None:
                m[key] = source.model[key]
        m.name = source.name or m.name
    return f"shape: model={m.name} (model._target_={m._target_}) from {_origin(source)}"


def settle_shape(cfg: DictConfig) -> tuple[str, ...]:
    """Take the model's shape from model.init_from's source, in place, before anything reads it; the plan's
    `shape:` line (none without model.init_from)."""
    if not cfg.model.get("init_from"):
        return ()
    if cfg.run.get("name"):  # a source the overwrite clears is refused as such, before it is read
        refuse_inside_overwritten(cfg, Path(str(cfg.run.root)).expanduser().resolve() / str(cfg.run.name))
    source = source_of(cfg)
    if source is None:
        return (f"shape: model={cfg.model.name} as composed ({cfg.model.init_from} carries no config of its shape; "
                "the weights are compared with it at launch)",)
    if source.model.get("_target_") or cfg.model.get("_target_"):
        return (_adopt_build(cfg, source),)
    return (_adopt_native(cfg, source),)
