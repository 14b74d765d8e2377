"""The commands a submission prints to follow it (`launcher.status`, `launcher.report`), in the form that works where
the user typed the submission. On the login node: the path as it is. From a laptop (`+remote=NAME`: launch.py runs the
launcher there with ORIGIN_ENV set): `--config-dir DIR NAME:PATH`, which runs the command on the login node and
brings its table or PNGs back; the login node's own path meant nothing on the laptop."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

ORIGIN_ENV = "SLURMTRAIN_REMOTE_ORIGIN"  # {"name", "config_dir", "overrides", "workdir"} of the laptop's command


def origin_env(name: str, config_dir: str | None, overrides: list[str], workdir: str) -> dict[str, str]:
    """The environment launch.py gives the launcher it runs on the login node: the remote as the laptop chose it
    (its `remote.KEY=VALUE` overrides too: another user, host or workdir finds the run where it is)."""
    return {ORIGIN_ENV: json.dumps({"name": name, "config_dir": config_dir, "overrides": list(overrides),
                                    "workdir": workdir})}


def _origin() -> dict[str, Any] | None:
    raw = os.environ.get(ORIGIN_ENV, "")
    try:
        origin = json.loads(raw) if raw else None
    except ValueError:
        return None
    return origin if isinstance(origin, dict) and origin.get("name") else None


def login_node_note() -> str:
    """From a laptop, a line saying which of a submission's commands are the login node's; '' on the login node."""
    origin = _origin()
    if origin is None:
        return ""
    return (f"  (follow, cancel and accounting are commands of remote {origin['name']}'s login node; status works "
            "here)\n")


def follow_command(module: str, path: str | Path) -> str:
    """`python -m MODULE PATH` as the user can type it where the submission was typed."""
    origin = _origin()
    if origin is None:
        return f"python -m {module} {shlex.quote(str(path))}"
    where, workdir = os.path.realpath(path), os.path.realpath(str(origin.get("workdir") or "/"))
    rel = os.path.relpath(where, workdir)
    shown = where if rel == ".." or rel.startswith("../") else rel  # outside the work directory: as it is
    config_dir = ["--config-dir", str(origin["config_dir"])] if origin.get("config_dir") else []
    overrides = [str(o) for o in origin.get("overrides") or []]
    return shlex.join(["python", "-m", module, *config_dir, *overrides, f"{origin['name']}:{shown}"])
