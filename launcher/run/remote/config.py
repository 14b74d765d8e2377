"""`+remote=NAME` found in a command line and read: conf/remote/NAME.yaml in the user's --config-dir or in
slurmtrain's conf/, typed by contract/config/remote.py, with `remote.KEY=VALUE` overrides; what is left of the
command line is what runs on the login node."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from contract.config.remote import RemoteConfig
from contract.config.suggest import close_key
from contract.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"
GROUP = "remote"
_SELECT = ("+remote=", "remote=")
# A remote's own key: `remote.KEY=VALUE`, and as Hydra users type a new key, `+remote.KEY=VALUE` (it went through to the
# login node's Hydra unread, a misspelt key with it).
_OVERRIDE = ("remote.", "+remote.", "++remote.")
_CONFIG_DIR = ("--config-dir", "-cd")
# Lists whose items are shell commands or patterns: YAML's `false`, `yes`, `1` are read as a boolean or a number, and
# OmegaConf turned them into the word `False` (run as a command).
_STRING_LISTS = ("setup", "exclude")


def is_override(arg: str) -> bool:
    """Whether ARG sets a remote's key (remote.KEY=VALUE, +remote.KEY=VALUE)."""
    return arg.startswith(_OVERRIDE)


def override_text(arg: str) -> str:
    """remote.KEY=VALUE as typed with or without Hydra's + or ++."""
    return arg.lstrip("+")


@dataclass
class RemoteArgs:
    name: str
    overrides: list[str]  # remote.KEY=VALUE, applied to the remote's config
    rest: list[str]  # the command line without the remote's own arguments
    config_dir: str | None


def split_args(argv: list[str]) -> RemoteArgs | None:
    """The remote's arguments of a `python -m launcher` command line; None without `+remote=`."""
    name, overrides, rest, config_dir = None, [], [], None
    for i, arg in enumerate(argv):
        if arg.startswith(_SELECT):
            name = arg.split("=", 1)[1]
            continue
        if is_override(arg):
            overrides.append(override_text(arg))
            continue
        if arg in _CONFIG_DIR and i + 1 < len(argv):
            config_dir = argv[i + 1]
        elif arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1]
        rest.append(arg)
    if name is None:
        if overrides:
            raise ConfigError(f"{overrides[0]} sets a remote's key, and no remote is chosen: add +remote=NAME")
        return None
    return RemoteArgs(name, overrides, rest, config_dir)


def yaml_path(name: str, config_dir: str | None) -> Path:
    dirs = ([Path(config_dir).expanduser()] if config_dir else []) + [CONF]
    for d in dirs:
        path = d / GROUP / f"{name}.yaml"
        if path.is_file():
            return path
    known = sorted({p.stem for d in dirs for p in (d / GROUP).glob("*.yaml")})
    where = " or ".join(str(d / GROUP) for d in dirs)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        raise ConfigError(f"no remote named {name!r} in {where}: did you mean +remote={close[0]}? (known: "
                          f"{', '.join(known)})")
    raise ConfigError(f"no remote named {name!r} in {where} (known: {', '.join(known) or 'none'}): write "
                      f"{GROUP}/{name}.yaml in your --config-dir (docs/remote.md)")


def load(name: str, config_dir: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RemoteConfig:
    path = yaml_path(name, config_dir)
    try:
        typed = OmegaConf.from_dotlist([o.removeprefix("remote.") for o in overrides])
        written = OmegaConf.load(path)
        _refuse_non_strings(name, written, str(path))
        _refuse_non_strings(name, typed, "on the command line")
        merged = OmegaConf.merge(OmegaConf.structured(RemoteConfig), written, typed, {"name": name})
        if OmegaConf.is_missing(merged, "host"):
            raise ConfigError(f"{path} sets no host: add `host: LOGIN_NODE` (a name or an alias of ~/.ssh/config)")
        remote = OmegaConf.to_object(merged)
    except ConfigKeyError as err:  # a misspelt key, in the YAML or an override
        raise ConfigError(_unknown_key(name, path, str(err.key), overrides)) from None
    except ValidationError as err:  # a value of the wrong type: `remote.port=abc`
        raise ConfigError(_wrong_type(name, path, str(err.full_key or err.key), overrides)) from None
    except OmegaConfBaseException as err:
        said = str(err).splitlines()[0]
        raise ConfigError(f"remote {name} ({path}): {said}; see docs/remote.md for its keys") from None
    except yaml.YAMLError as err:  # `host: [x`: a traceback and exit 1 before
        said = " ".join(str(err).split())
        raise ConfigError(f"remote {name}: {path} is not valid YAML ({said}): fix it") from None
    assert isinstance(remote, RemoteConfig)
    for f in dataclasses.fields(RemoteConfig):  # the declared ranges (remote.port=0 was silently ignored)
        lo, hi, lo_open, hi_open = f.metadata.get("range", (None, None, False, False))
        value = getattr(remote, f.name)
        if value is None or (lo is None and hi is None):
            continue
        if (lo is not None and (value <= lo if lo_open else value < lo)) or \
                (hi is not None and (value >= hi if hi_open else value > hi)):
            ends = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            raise ConfigError(f"remote.{f.name}={value} is out of range: give a value in {ends}".replace("None", "∞"))
    remote.control_persist = _control_persist(remote.control_persist, path, overrides)
    if remote.workdir == "~" or remote.workdir.startswith("~/"):  # the remote shell starts in the home directory
        remote.workdir = remote.workdir.removeprefix("~").lstrip("/") or "."
    return remote


def _refuse_non_strings(name: str, source: Any, where: str) -> None:
    """setup and exclude items must be strings as typed: `setup: [false]` ran the command `False`."""
    if not isinstance(source, DictConfig):
        return
    for key in _STRING_LISTS:
        items = source.get(key)
        if not isinstance(items, ListConfig):
            continue
        for i, item in enumerate(items):
            if not isinstance(item, str):
                shown = json.dumps(item)
                typed = _typed_word(where, key, i) or shown
                raise ConfigError(f"remote {name}: {key}[{i}] ({where}) is read as {type(item).__name__} {shown}, "
                                  f"not a string: quote it ('{typed}') if you mean the text {typed} (docs/remote.md)")


def _typed_word(path: str, key: str, i: int) -> str | None:
    """The item as written in the remote's YAML file (`yes` reads as true: the quote to add is 'yes'), or None."""
    try:
        items = yaml.load(Path(path).read_text(), Loader=yaml.BaseLoader).get(key)  # every scalar as its text
        return str(items[i]) if isinstance(items, list) and isinstance(items[i], str) else None
    except (OSError, yaml.YAMLError, AttributeError, IndexError):
        return None


def _unknown_key(name: str, path: Path, key: str, overrides: list[str] | tuple[str, ...]) -> str:
    """A key a remote does not have, where it was given, and the key it most likely means (else all of them)."""
    keys = [f.name for f in dataclasses.fields(RemoteConfig) if f.name != "name"]
    given = next((o.split("=", 1)[0] for o in overrides
                  if o == f"remote.{key}" or o.startswith((f"remote.{key}=", f"remote.{key}."))), None)
    where = f"{given}=..." if given else f"in {path}"
    close = close_key(key.strip(), keys)
    fix = f"did you mean {close}?" if close else f"a remote's keys are {', '.join(keys)}"
    return f"remote {name} has no key {key!r} ({where}): {fix} (docs/remote.md)"


# What a remote's typed keys take, in words: an error names it and the fix.
_TAKES = {"port": ("an integer port 1-65535 (ssh -p)", "22"), "max_snapshot_mb": ("a number of megabytes", "200")}
# ssh's ControlPersist: yes/true, no/false, or a time (a number of seconds, or numbers with units s m h d w: 10m, 1h30m).
_PERSIST_TIME = re.compile(r"(\d+[smhdwSMHDW]?)+")


def _where(key: str, path: Path, overrides: list[str] | tuple[str, ...]) -> str:
    """Where the value was given: `remote.KEY=VALUE` on the command line, else the remote's YAML file."""
    given = next((o for o in overrides if o.split("=", 1)[0] == f"remote.{key}"), None)
    return given if given is not None else f"{key} in {path}"


def _wrong_type(name: str, path: Path, key: str, overrides: list[str] | tuple[str, ...]) -> str:
    where = _where(key, path, overrides)
    takes, example = _TAKES.get(key, ("a value of its type", "VALUE"))
    return f"remote {name}: {where}: remote.{key} takes {takes}: write remote.{key}={example} (docs/remote.md)"


def _control_persist(value: str, path: Path, overrides: list[str] | tuple[str, ...]) -> str:
    """ssh's ControlPersist as ssh reads it, checked here (ssh said only "Bad ControlPersist argument", and was
    blamed): YAML's and OmegaConf's booleans (`yes` arrives as "True", which ssh refuses) become yes and no."""
    text = {"True": "yes", "False": "no"}.get(str(value), str(value).strip())
    if text in ("yes", "no", "true", "false") or _PERSIST_TIME.fullmatch(text):
        return text
    where = _where("control_persist", path, overrides)
    raise ConfigError(f"{where}: ssh's ControlPersist takes yes, no or a time (600 seconds, 10m, 1h30m): write "
                      "remote.control_persist=10m, for example (docs/remote.md)")
