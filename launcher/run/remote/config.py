"""`+remote=NAME` found in a command line and read: conf/remote/NAME.yaml in the user's --config-dir or in
slurmtrain's conf/, typed by contract/config/remote.py, with `remote.KEY=VALUE` overrides; what is left of the
command line is what runs on the login node."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from contract.config.remote import RemoteConfig
from contract.config.suggest import close_key
from contract.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"
GROUP = "remote"
_SELECT = ("+remote=", "remote=")
_CONFIG_DIR = ("--config-dir", "-cd")


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
        if arg.startswith("remote."):
            overrides.append(arg)
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
    raise ConfigError(f"no remote named {name!r} in {where} (known: {', '.join(known) or 'none'}): write "
                      f"{GROUP}/{name}.yaml in your --config-dir (docs/remote.md)")


def load(name: str, config_dir: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RemoteConfig:
    path = yaml_path(name, config_dir)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RemoteConfig), OmegaConf.load(path),
                                 OmegaConf.from_dotlist([o.removeprefix("remote.") for o in overrides]),
                                 {"name": name})
        if OmegaConf.is_missing(merged, "host"):
            raise ConfigError(f"{path} sets no host: add `host: LOGIN_NODE` (a name or an alias of ~/.ssh/config)")
        remote = OmegaConf.to_object(merged)
    except ConfigKeyError as err:  # a misspelt key, in the YAML or an override
        raise ConfigError(_unknown_key(name, path, str(err.key), overrides)) from None
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
    if remote.workdir == "~" or remote.workdir.startswith("~/"):  # the remote shell starts in the home directory
        remote.workdir = remote.workdir.removeprefix("~").lstrip("/") or "."
    return remote


def _unknown_key(name: str, path: Path, key: str, overrides: list[str] | tuple[str, ...]) -> str:
    """A key a remote does not have, where it was given, and the key it most likely means (else all of them)."""
    keys = [f.name for f in dataclasses.fields(RemoteConfig) if f.name != "name"]
    given = next((o.split("=", 1)[0] for o in overrides if o.startswith((f"remote.{key}=", f"remote.{key}."))), None)
    where = f"{given}=..." if given else f"in {path}"
    close = close_key(key.strip(), keys)
    fix = f"did you mean {close}?" if close else f"a remote's keys are {', '.join(keys)}"
    return f"remote {name} has no key {key!r} ({where}): {fix} (docs/remote.md)"
