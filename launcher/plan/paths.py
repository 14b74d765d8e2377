"""Every path the config names, made absolute once at launch: the keys contract/config/schema.py declares with
`schema.path_key` (data.path, data.sources.NAME.path, eval.sets.NAME.path, model.init_from, model.config_path, run.root),
`~` expanded and a relative path joined to the directory the launcher runs in. config.yaml then means the same
from any directory (the ranks, an evaluation job, launcher.sample and export, a job whose working directory
differs), and the derived run name hashes what the run reads: the same command from the same directory resumes the
same run, the same relative path typed elsewhere names other data and another run.

A path that is already absolute is kept as typed (symlinks and all), so run names derived from it do not change.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from launcher.checks.key_checks import path_keys
from launcher.plan.run_name import derived_run_name, hashed


def absolute(text: str, base: Path) -> str:
    """`text` as an absolute path: `~` expanded; a relative path joined to `base` (its `.` parts and doubled slashes
    dropped, `..` kept: through a symlink it means what the file system says); an absolute one kept as typed."""
    expanded = os.path.expanduser(text)
    return expanded if os.path.isabs(expanded) else str(base / expanded)


def _make_absolute(node: DictConfig, key: str, base: Path) -> str | None:
    """Make node[key] absolute; what it was, if that changed it."""
    if key not in node or OmegaConf.is_missing(node, key):
        return None
    value = node.get(key)
    if value is None or value == "" or isinstance(value, bool) or OmegaConf.is_config(value):
        return None  # unset, or not a path at all: the checks of that key say so
    fixed = absolute(str(value), base)
    if fixed == value:
        return None
    node[key] = fixed
    return str(value)


def make_absolute(cfg: DictConfig, base: Path | None = None) -> dict[str, str]:
    """Every path key of `cfg` made absolute in place, against `base` (default: the current directory); the keys
    it changed, with their values as typed."""
    base = Path.cwd() if base is None else base
    typed: dict[str, str | None] = {}
    with open_dict(cfg):
        for key, inner in path_keys():
            section, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, section) if section else cfg
            if not isinstance(parent, DictConfig):
                continue
            if not inner:
                typed[key] = _make_absolute(parent, leaf, base)
                continue
            entries = parent.get(leaf)
            if isinstance(entries, DictConfig):
                for name in map(str, entries.keys()):
                    entry = entries.get(name)
                    if isinstance(entry, DictConfig):
                        typed[f"{key}.{name}.{inner}"] = _make_absolute(entry, inner, base)
    return {key: value for key, value in typed.items() if value is not None}


# Made absolute before the run name was derived long before this module: their typed values were never hashed.
ABSOLUTE_BEFORE = ("model.init_from", "model.config_path")


def run_name(cfg: DictConfig, typed: dict[str, str]) -> str:
    """The derived run name (launcher/plan/run_name.py). Names derived before paths were made absolute hashed
    relative paths as typed: where only the directory of that earlier name exists, and its config.yaml reads the
    same paths from here, that is this run, and the same command goes on resuming it."""
    name = derived_run_name(cfg)
    root = Path(str(cfg.run.root))
    earlier = {key: value for key, value in typed.items() if key not in ABSOLUTE_BEFORE}
    if not any(map(hashed, earlier)) or (root / name).exists():
        # The name hashes none of the paths typed relative (run.root, relative by default, is the usual one): the
        # earlier name is this one, short of a hashed setting that interpolates such a path. Deriving it costs a
        # copy of the config and a second hash, on every point of a sweep.
        return name
    before = pickle.loads(pickle.dumps(cfg))  # a copy, at a third of copy.deepcopy's cost
    with open_dict(before):
        for key, value in earlier.items():
            OmegaConf.update(before, key, value, merge=False)
    old_name = derived_run_name(before)
    try:
        saved = OmegaConf.load(root / old_name / "config.yaml")
    except Exception:  # noqa: BLE001 - none there, or unreadable: not that run
        return name
    if not isinstance(saved, DictConfig):
        return name
    make_absolute(saved)
    same = all(OmegaConf.select(saved, key, default=None) == OmegaConf.select(cfg, key) for key in earlier)
    return old_name if same else name
