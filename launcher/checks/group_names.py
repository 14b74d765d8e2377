"""A section's name says what trains: it comes from the group option that set the section, never a free label.

`model.name`, `data.name`, `optim.name`, `strategy.name` and `precision.name` are set by the group choice
(`model=tiny`). Typed on the command line (`model.name=llama3_8b`) a name would label a run with what does not
train (the run directory, the plan, config.yaml), so it is refused, naming the group choice to make instead. The
training side picks the data source and the optimizer by name: a name it does not implement is refused with the
choices. A user's `_target_` given over one of our options (`model._target_=my.Net` with the default `model=tiny`)
renames the section after the target, so that config.yaml and the run name say what trained.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, open_dict

from contract.errors import ConfigError
from contract.rules.optimizers import OPTIMIZERS
from launcher.checks.overrides import override_key, typed_exactly, typed_for

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "data", "optim", "strategy", "precision")
# What the training side implements (train/data/sources.py build_source, train/optim.py build_optimizer).
DATA_SOURCES = ("synthetic", "tokens")


@functools.cache
def our_options(group: str) -> dict[str, Any]:
    """slurmtrain's own options of a group: name -> the `_target_` its YAML sets (None for none)."""
    out: dict[str, Any] = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        body = yaml.safe_load(path.read_text()) or {}
        out[path.stem] = body.get("_target_") if isinstance(body, dict) else None
    return out


@functools.cache
def default_choices() -> dict[str, str]:
    """The group options conf/config.yaml picks when the command names none."""
    body = yaml.safe_load((CONF_DIR / "config.yaml").read_text()) or {}
    out: dict[str, str] = {}
    for entry in body.get("defaults", []):
        if isinstance(entry, dict):
            out.update({str(k): str(v) for k, v in entry.items()})
    return out


def group_choice(group: str) -> str | None:
    """The option chosen for `group`: as typed (`model=mine`), else our default."""
    typed = typed_exactly(group)
    if typed is not None:
        return typed.split("=", 1)[1]
    return default_choices().get(group)


def _typed_name(group: str, name: str) -> None:
    typed = typed_for(f"{group}.name")
    if typed is None or override_key(typed) != f"{group}.name":
        return
    options = our_options(group)
    if name == group_choice(group):
        raise ConfigError(f"{typed} is what {group}={name} sets already: drop {typed}")
    if name in options:
        raise ConfigError(f"{typed} would name the {group} without choosing it: choose the group, {group}={name} "
                          f"(not {group}.name=...)")
    fixes = {
        "model": f"name the run with run.name={name}, or define your model in your own conf/model/{name}.yaml "
                 "(--config-dir conf)",
        "data": "give your dataset with data._target_=module.Class, or define it in your own "
                f"conf/data/{name}.yaml (--config-dir conf)",
    }
    fix = fixes.get(group, f"choose {group}= one of {', '.join(options)}")
    raise ConfigError(f"{typed}: {group}.name comes from the group option ({group}= one of "
                      f"{', '.join(options)}): {fix}")


def _implemented(cfg: DictConfig) -> None:
    for group in ("model", "data"):
        section = cfg[group]
        if section.get("args") and not section.get("_target_"):
            typed = typed_for(f"{group}.args")
            drop = f"drop {typed}" if typed else f"remove {group}.args from your {group} YAML"
            raise ConfigError(f"{group}.args are the arguments of your own {group} (a {group}._target_), and "
                              f"{group}={section.name} takes none: {drop}, or give {group}._target_=module.Name")
    d = cfg.data
    if not d.get("_target_") and d.name not in DATA_SOURCES:
        raise ConfigError(f"data.name={d.name} is not a data source slurmtrain reads ({', '.join(DATA_SOURCES)}): "
                          "choose data=synthetic or data=tokens, or give your own dataset with "
                          "data._target_=module.Class")
    if cfg.optim.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name={cfg.optim.name} is not an optimizer slurmtrain implements (one of "
                          f"{', '.join(OPTIMIZERS)}): choose one of those, optim=adamw for example")


def _named_after_target(cfg: DictConfig, group: str) -> None:
    """`group._target_` given over one of our options whose YAML trains something else: name it after the target."""
    section = cfg[group]
    target = section.get("_target_")
    if not target or section.name not in our_options(group) or our_options(group)[section.name] == target:
        return
    with open_dict(cfg):
        section.name = str(target).rsplit(".", 1)[-1].rsplit(":", 1)[-1]


def settle_names(cfg: DictConfig) -> None:
    """Refuse a typed name and a name the training side does not implement; name a `_target_` after itself."""
    _implemented(cfg)
    for group in GROUPS:
        _typed_name(group, str(cfg[group].name))
    for group in ("model", "data"):
        _named_after_target(cfg, group)
