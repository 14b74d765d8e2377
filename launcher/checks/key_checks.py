"""Checks of single keys against the schema, before anything runs: no key the schema does not declare, every
numeric key within its declared range, every enumerated key one of its values.

Hydra refuses a misspelled key, but `+trainer.foo=1` adds one, which would then be ignored (and change the derived
run name): refused here. Ranges are declared once, next to each key, with `schema.num` (metadata "range").
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from contract.config import schema
from contract.config.suggest import close_key
from contract.errors import ConfigError, shown
from contract.rules.grad_compression import CHOICES as GRAD_COMPRESSION
from contract.rules.log_backends import check_logger
from contract.rules.schedules import DECAY_SHAPES, SCHEDULES
from launcher.checks.overrides import as_typed, override_key, typed, typed_for

CHOICES = {
    "model.position": ("rope", "learned"),
    "model.mlp": ("swiglu", "gelu"),
    "model.norm": ("rmsnorm", "layernorm"),
    "data.dtype": ("uint16", "uint32", "uint8", "int32", "int64"),
    "optim.lr_scaling": ("none", "linear", "sqrt"),
    "optim.schedule": SCHEDULES,
    "optim.decay_shape": DECAY_SHAPES,
    "logger.mode": ("offline", "online", "disabled"),
    "precision.compute_dtype": ("float32", "bfloat16", "float16"),
    "precision.float8_recipe": ("tensorwise", "rowwise"),
    "precision.float8_filter": ("auto", "all"),
    "trainer.loss_impl": ("chunked", "fused"),
    "strategy.compile_unit": ("blocks", "model"),
    "strategy.grad_compression": GRAD_COMPRESSION,
    "checkpoint.verify": ("size", "full"),
    "local.backend": (None, "gloo", "nccl"),
    "parallel.pp_schedule": ("1f1b", "interleaved_1f1b"),
    "stability.nonfinite": ("skip", "rollback", "stop"),
}


def _section_type(hint: Any) -> type | None:
    """The dataclass behind a field's type hint (`X`, `X | None`), or None for a plain value."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate  # type: ignore[return-value]
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Cached: evaluating the string annotations costs milliseconds per class, and a sweep checks every point.
    return typing.get_type_hints(cls)


def _holds_value(node: dict[str, Any], key: str) -> bool:
    """`key` is in the section and not missing (`???`): a removed section (`~model`) is left with a missing value."""
    return key in node and not (isinstance(node[key], str) and node[key] == MISSING)


@functools.cache
def _sections(cls: type) -> dict[str, type]:
    """The fields of `cls` that are sections themselves (a dataclass), and their dataclass."""
    return {name: sub for name, hint in _hints(cls).items() if (sub := _section_type(hint)) is not None}


def _missing(node: dict[str, Any], cls: type, prefix: str) -> None:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if _holds_value(node, f.name) or type(None) in typing.get_args(hints[f.name]):
            continue
        name = f"{prefix}{f.name}"
        if typed_for(name) is None and f.name == "name" and prefix:
            section = prefix.rstrip(".")
            raise ConfigError(f"{name} is missing: add `name: NAME` (the option's file name) to the {section} "
                              f"YAML file of your {section}= option")
        fix = (f"choose one with {name}=NAME" if _section_type(hints[f.name]) else
               f"drop ~{name} (the name comes from the group option)" if f.name == "name" else
               f"set {name}=VALUE")
        raise ConfigError(f"{name} is required and was removed (~{name}): {fix}")


# Names other tools give our keys (Hugging Face, nanoGPT, Megatron, torchrun): close in meaning, not spelling.
SYNONYMS = {
    "learning_rate": "optim.lr", "lr": "optim.lr", "wd": "optim.weight_decay", "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.grad_clip", "grad_clip": "optim.grad_clip", "clip_grad": "optim.grad_clip",
    "gradient_clipping": "optim.grad_clip", "warmup": "optim.warmup_steps", "warmup_iters": "optim.warmup_steps",
    "lr_schedule": "optim.schedule", "scheduler": "optim.schedule", "lr_scheduler": "optim.schedule",
    "gradient_accumulation_steps": "trainer.grad_accum_steps", "grad_accum": "trainer.grad_accum_steps",
    "batch_size": "trainer.micro_batch_size", "per_device_train_batch_size": "trainer.micro_batch_size",
    "max_iters": "trainer.max_steps", "num_steps": "trainer.max_steps", "train_steps": "trainer.max_steps",
    "steps": "trainer.max_steps", "log_interval": "trainer.log_every", "logging_steps": "trainer.log_every",
    "max_epochs": "trainer.max_epochs", "num_train_epochs": "trainer.max_epochs", "epochs": "trainer.max_epochs",
    "train_tokens": "trainer.max_tokens", "max_tokens": "trainer.max_tokens", "tokens": "trainer.max_tokens",
    "save_every": "trainer.ckpt_every", "save_steps": "trainer.ckpt_every", "checkpoint_every": "trainer.ckpt_every",
    "eval_every": "eval.every", "eval_interval": "eval.every", "val_every": "eval.every", "eval_steps": "eval.every",
    "eval_iters": "eval.batches", "hidden_size": "model.d_model", "n_embd": "model.d_model",
    "num_layers": "model.n_layers", "n_layer": "model.n_layers", "num_hidden_layers": "model.n_layers",
    "num_heads": "model.n_heads", "n_head": "model.n_heads", "num_attention_heads": "model.n_heads",
    "block_size": "model.max_seq_len", "context_length": "model.max_seq_len", "seq_len": "data.seq_len",
    "max_position_embeddings": "model.max_seq_len", "gpus": "local.nproc", "num_gpus": "local.nproc",
    "nproc_per_node": "local.nproc", "output_dir": "run.root", "out_dir": "run.root", "dir": "run.root",
}


def _leaves(cls: type, prefix: str = "") -> dict[str, str]:
    """Every declared key: its lower-cased leaf name -> the full key (the first where a leaf repeats)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        sub = _section_type(_hints(cls)[f.name])
        if sub is not None:
            out = {**_leaves(sub, f"{prefix}{f.name}."), **out}
        else:
            out.setdefault(f.name.lower(), f"{prefix}{f.name}")
    return out


def suggest(name: str, keys: list[str]) -> str | None:
    """What an undeclared key `name` (section.leaf) most likely means: a key of its section close in spelling
    (case aside), the same key in another section (trainer.lr -> optim.lr), or a name other tools use for one of
    ours (learning_rate -> optim.lr)."""
    prefix, _, leaf = name.rpartition(".")
    prefix = f"{prefix}." if prefix else ""
    same_case = {k.lower(): k for k in keys}
    if leaf.lower() in same_case:
        return f"{prefix}{same_case[leaf.lower()]}"
    close = close_key(leaf, keys)
    if close:
        return f"{prefix}{close}"
    meant = SYNONYMS.get(leaf.lower()) or _leaves(schema.Config).get(leaf.lower())
    return meant if meant and meant != name else None


def unknown_key_error(name: str, close: str | None) -> ConfigError:
    """`name` is not declared: quote the override as typed (or say it came from a YAML file)."""
    typed = typed_for(name)
    shown = override_key(typed) if typed and override_key(typed).startswith(name) else name
    hint = f"did you mean {close}? " if close else ""
    fix = f"drop {typed}" if typed else f"remove {name} from the YAML file that sets it"
    return ConfigError(f"{shown} is not a slurmtrain key: {hint}{fix} (`python -m launcher --cfg job` lists every "
                       "key)")


def _unknown(node: dict[str, Any], cls: type, prefix: str) -> None:
    hints, sections = _hints(cls), _sections(cls)
    _missing(node, cls, prefix)
    for key, value in node.items():
        name = f"{prefix}{key}"
        if str(key) not in hints:
            raise unknown_key_error(name, suggest(name, list(hints)))
        if str(key) in sections and value is not None:
            # A section that is missing or an interpolation holds no keys of its own: its required ones are missing.
            _unknown(value if isinstance(value, dict) else {}, sections[str(key)], f"{name}.")


def _number(x: float) -> str:
    return shown(x) if float(x).is_integer() else f"{x:g}"


def _describe(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if hi is None:
        return f"{'above' if lo_open else 'at least'} {_number(lo)}"  # type: ignore[arg-type]
    if lo is None:
        return f"{'below' if hi_open else 'at most'} {_number(hi)}"
    return f"in {'(' if lo_open else '['}{_number(lo)}, {_number(hi)}{')' if hi_open else ']'}"


def _in_range(value: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> bool:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return False
    if lo is not None and (value < lo or (lo_open and value == lo)):
        return False
    return not (hi is not None and (value > hi or (hi_open and value == hi)))


def _check_value(name: str, value: Any, bounds: tuple[Any, ...]) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not _in_range(value, *bounds):
        finite = "a finite value" if isinstance(value, float) and not math.isfinite(value) else "a value"
        raise ConfigError(f"{as_typed(name, value)} is out of range: set {name} to {finite} {_describe(*bounds)}")


def _ranges(cfg: DictConfig, node: dict[str, Any], cls: type, prefix: str) -> None:
    sections = _sections(cls)
    for f in dataclasses.fields(cls):
        if not _holds_value(node, f.name):
            continue
        name, value = f"{prefix}{f.name}", node[f.name]
        if f.name in sections:
            if isinstance(value, dict):
                _ranges(cfg, value, sections[f.name], f"{name}.")
            continue
        bounds = f.metadata.get("range")
        if bounds is None or isinstance(value, str):
            continue  # a string is no number; an interpolated value is checked at its source key
        if isinstance(value, (dict, list)) and any(isinstance(v, str) for v in _items(value)):
            value = OmegaConf.select(cfg, name)  # an interpolated (or missing) entry: as the config resolves it
        if isinstance(value, (dict, DictConfig)):
            for key, item in value.items():
                _check_value(f"{name}.{key!s}", item, bounds)
        elif isinstance(value, (list, ListConfig)):
            for i, item in enumerate(value):
                _check_value(f"{name}[{i}]", item, bounds)
        else:
            _check_value(name, value, bounds)


def _items(value: dict[str, Any] | list[Any]) -> list[Any]:
    return list(value.values()) if isinstance(value, dict) else value


def check_choices(cfg: DictConfig, tree: dict[str, Any] | None = None) -> None:
    """`tree`: cfg as plain values (check_keys has it), read instead of a select per key."""
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key) if tree is None else _select(cfg, tree, key)
        if value not in allowed:
            shown = [str(a) for a in allowed if a is not None]
            meant = difflib.get_close_matches(str(value), shown, n=1) or shown
            raise ConfigError(f"{key}={value} is not one of {', '.join(shown)}: set {key}={meant[0]}")
    check_logger(cfg.logger)  # one name or a list of them (contract/rules/log_backends.py)
    if cfg.get("cluster") is not None and cfg.cluster.backend not in ("nccl", "gloo"):
        raise ConfigError(f"cluster.backend={cfg.cluster.backend} is not one of nccl, gloo: set cluster.backend=nccl "
                          "(GPUs) or gloo (CPUs)")
    names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}
    p = cfg.precision
    if names.get(p.name, p.compute_dtype) != p.compute_dtype:
        raise ConfigError(f"precision.name={p.name} with precision.compute_dtype={p.compute_dtype} disagree: choose "
                          f"the group, precision={p.name} (not precision.name=...)")


def plain_select(tree: dict[str, Any], key: str, default: Any = None) -> Any:
    """`OmegaConf.select(cfg, key, default=default)` read from `tree`, cfg as plain values (`OmegaConf.to_container`),
    at a fraction of a select's cost: the default where the key is absent or missing (`???`)."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if isinstance(node, str) and node == MISSING else node


def _select(cfg: DictConfig, tree: dict[str, Any], key: str) -> Any:
    """`OmegaConf.select(cfg, key)` from `tree`, cfg's plain values unresolved: an interpolation resolved by cfg."""
    value = plain_select(tree, key)
    return OmegaConf.select(cfg, key) if isinstance(value, str) and "${" in value else value


def check_keys(cfg: DictConfig) -> None:
    """Unknown keys, numeric ranges, enumerated values and typed switches; raises ConfigError naming the key and the
    fix.

    The walks read the config as plain values, taken once (OmegaConf's node access costs microseconds a key, and
    a sweep checks every point): a typed value stays typed, an interpolation stays unresolved (it is checked at its
    source key) and a missing value reads `???`."""
    tree: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    _unknown(tree, schema.Config, "")
    _ranges(cfg, tree, schema.Config, "")
    check_choices(cfg, tree)
    check_typed_switches()


# What a typed true/false key may be given: OmegaConf also takes any integer (stability.enabled=2 is true), which
# reads as a count or a mistake rather than a switch.
SWITCH_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "null"}  # null: the optional ones


@functools.cache
def bool_keys(cls: type = schema.Config, prefix: str = "") -> frozenset[str]:
    """Every key the schema declares as true/false."""
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        hint = _hints(cls)[f.name]
        sub = _section_type(hint)
        if sub is not None:
            out |= bool_keys(sub, f"{prefix}{f.name}.")
        elif hint is bool or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                              and bool in typing.get_args(hint)):
            out.add(f"{prefix}{f.name}")
    return frozenset(out)


@functools.cache
def path_keys(cls: type = schema.Config, prefix: str = "") -> tuple[tuple[str, str], ...]:
    """Every key the schema declares as a path (schema.path_key), with the key inside each of its entries ("" for a
    key that is itself the path): (data.path, ""), (data.sources, path), ..."""
    out: list[tuple[str, str]] = []
    for f in dataclasses.fields(cls):
        sub = _section_type(_hints(cls)[f.name])
        if sub is not None:
            out += path_keys(sub, f"{prefix}{f.name}.")
        elif "path" in f.metadata:
            out.append((f"{prefix}{f.name}", f.metadata["path"]))
    return tuple(out)


def check_typed_switches() -> None:
    """A true/false key typed with another value (a number) is refused rather than read as true."""
    for override in typed():
        if "=" not in override:
            continue
        key, value = override_key(override), override.split("=", 1)[1].strip().strip("'\"")
        if key in bool_keys() and value.lower() not in SWITCH_WORDS and "${" not in value:  # ${...}: resolved later
            raise ConfigError(f"{key}={value} is not true or false: set {key}=true or {key}=false")


def numeric_keys_without_range() -> list[str]:
    """Every int or float key the schema declares without a range (a test keeps this empty)."""
    missing: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            sub = _section_type(hints[f.name])
            if sub is not None:
                walk(sub, f"{prefix}{f.name}.")
                continue
            text = str(hints[f.name])
            numeric = any(t in (int, float) for t in (hints[f.name], *typing.get_args(hints[f.name])))
            numeric = numeric or "float]" in text or "int]" in text
            if numeric and "range" not in f.metadata:
                missing.append(f"{prefix}{f.name}")

    walk(schema.Config, "")
    return missing
