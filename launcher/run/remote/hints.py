"""The commands a submission prints to follow it (`launcher.status`, `launcher.report`), in the form that works where
the user typed the submission. On the login node: the path as it is. From a laptop (`+remote=NAME`: launch.py runs the
launcher there with ORIGIN_ENV set): `--config-dir DIR NAME:PATH`, which runs the command on the login node and
brings its table or PNGs back; the login node's own path meant nothing on the laptop."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

ORIGIN_ENV = "SLURMTRAIN_REMOTE_ORIGIN"  # {"name", "config_dir", "workdir"} of the laptop's command


def origin_env(name: str, config_dir: str | None, workdir: str) -> dict[str, str]:
    """The environment launch.py gives the launcher it runs on the login node."""
    return {ORIGIN_ENV: json.dumps({"name": name, "config_dir": config_dir, "workdir": workdir})}


def follow_command(module: str, path: str | Path) -> str:
    """`python -m MODULE PATH` as the user can type it where the submission was typed."""
    raw = os.environ.get(ORIGIN_ENV, "")
    try:
        origin = json.loads(raw) if raw else None
    except ValueError:
        origin = None
    if not isinstance(origin, dict) or not origin.get("name"):
        return f"python -m {module} {shlex.quote(str(path))}"
    where, workdir = os.path.realpath(path), os.path.realpath(str(origin.get("workdir") or "/"))
    rel = os.path.relpath(where, workdir)
    shown = where if rel == ".." or rel.startswith("../") else rel  # outside the work directory: as it is
    config_dir = f"--config-dir {shlex.quote(origin['config_dir'])} " if origin.get("config_dir") else ""
    return f"python -m {module} {config_dir}{shlex.quote(origin['name'] + ':' + shown)}"
