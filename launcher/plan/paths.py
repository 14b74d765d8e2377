"""Every path the config names, made absolute once at launch: the keys contract/config/schema.py declares with
`schema.path_key` (data.path, data.sources.NAME.path, eval.sets.NAME.path, model.init_from, model.config_path, run.root),
`~` expanded and a relative path joined to the directory the launcher runs in. config.yaml then means the same
from any directory (the ranks, an evaluation job, launcher.sample and export, a job whose working directory
differs), and the derived run name hashes what the run reads: the same command from the same directory resumes the
same run, the same relative path typed elsewhere names other data and another run.

Every path is normalised lexically (os.path.normpath: `.`, `..` and doubled slashes resolved in the text, not
realpath: symlinks stay as typed), so `data.path=corpus` and `data.path=../a/corpus` typed in a/ name the same
data and the same run. Runs named before (relative paths hashed as typed, or absolute ones before normalising)
go on with the same command: run_name finds them.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from launcher.checks.key_checks import path_keys
from launcher.plan.run_name import derived_run_name, hashed


def absolute(text: str, base: Path) -> str:
    """`text` as an absolute, normalised path: `~` expanded, a relative path joined to `base`, `.` and `..` parts
    and doubled slashes resolved in the text (symlinks are not followed)."""
    return os.path.normpath(_joined(text, base))


def _joined(text: str, base: Path) -> str:
    """`text` made absolute as slurmtrain did before normalising: `..` parts kept (run names hashed that)."""
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


def run_name(cfg: DictConfig, typed: dict[str, str], base: Path | None = None) -> str:
    """The derived run name (launcher/plan/run_name.py). Names derived earlier hashed other forms of the same
    paths: relative paths as typed (before paths were made absolute), or absolute ones with their `..` parts (before
    they were normalised). Where only the directory of such an earlier name exists, and its config.yaml reads the
    same paths from here, that is this run, and the same command goes on resuming it."""
    name = derived_run_name(cfg)
    root = Path(str(cfg.run.root))
    if (root / name).exists():
        return name
    base = Path.cwd() if base is None else base
    as_typed = {key: value for key, value in typed.items() if key not in ABSOLUTE_BEFORE}
    joined = {key: _joined(value, base) for key, value in typed.items()}
    for earlier in (as_typed, {k: v for k, v in joined.items() if v != OmegaConf.select(cfg, k)}):
        # A name that hashes none of these paths (run.root, relative by default, is the usual one) is the same name:
        # deriving it again would cost a copy of the config and a second hash, on every point of a sweep.
        found = _same_run(cfg, root, earlier) if any(map(hashed, earlier)) else None
        if found is not None:
            return found
    return name


def _same_run(cfg: DictConfig, root: Path, earlier: dict[str, str]) -> str | None:
    """The name `cfg` had with the `earlier` forms of its paths, where that run is there and reads the same paths."""
    before = pickle.loads(pickle.dumps(cfg))  # a copy, at a third of copy.deepcopy's cost
    with open_dict(before):
        for key, value in earlier.items():
            OmegaConf.update(before, key, value, merge=False)
    old_name = derived_run_name(before)
    try:
        saved = OmegaConf.load(root / old_name / "config.yaml")
    except Exception:  # noqa: BLE001 - none there, or unreadable: not that run
        return None
    if not isinstance(saved, DictConfig):
        return None
    make_absolute(saved)
    same = all(OmegaConf.select(saved, key, default=None) == OmegaConf.select(cfg, key) for key in earlier)
    return old_name if same else None
