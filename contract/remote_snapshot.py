"""A project snapshot on a cluster (`+remote`): WORKDIR/snapshots/ID/, a copy of the user's project directory
that never changes once made, and the manifest both sides read.

    ID            the first 16 hex digits of the SHA-256 of the file list (path, executable bit and SHA-256 of
                  each file, in path order): the same content is the same snapshot, copied once
    MANIFEST      ID/.slurmtrain-snapshot.json, written last (its presence marks a complete snapshot):
                  {"format": 1, "id", "created", "source" (the local directory), "git": null (the same files are
                  launched at many commits: each launch's is in GIT_STATES; older manifests held the first
                  launch's), "files": [{"path", "size", "sha256", "executable"}]}
    outputs       ID/outputs -> ../../outputs: run.root's default lands in WORKDIR/outputs, shared by snapshots
    GIT_STATES    ID/.slurmtrain-git/KEY.json: the git state ({"commit", "dirty", "diff"}) of each launch (the same
                  content is launched again at another commit when the commit changed no shipped file): the launcher
                  runs with GIT_STATE_ENV=KEY and its run records that state; without it, the commit is unknown

The launcher runs in ID/ on the cluster, so a job (and its requeues) imports the code it was submitted with;
the run directory's environment.json names the snapshot and commit (`snapshot_record`) and snapshot.diff holds
the uncommitted changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST = ".slurmtrain-snapshot.json"
SNAPSHOTS = "snapshots"
OUTPUTS = "outputs"
DIFF_FILE = "snapshot.diff"
GIT_STATES = ".slurmtrain-git"
GIT_STATE_ENV = "SLURMTRAIN_SNAPSHOT_GIT"

# Never shipped, git tree or not: secrets (keys, .env files, credentials) and what is not code (version control,
# caches, virtual environments, run outputs, trackers' local files).
SECRET_EXCLUDE = (".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "id_rsa*", "id_dsa*", "id_ecdsa*",
                  "id_ed25519*", ".ssh", ".netrc", ".pypirc", ".git-credentials", "credentials*", ".aws", ".gnupg")
# Bytecode, left out of a git tree's untracked files too: a local run's fresh .pyc files made a new snapshot (and a copy)
# of code that had not changed.
BYTECODE = ("__pycache__", "*.pyc")
DEFAULT_EXCLUDE = SECRET_EXCLUDE + BYTECODE + (
    ".git", ".hg", ".svn", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".ipynb_checkpoints", "node_modules", "*.egg-info", "outputs", "multirun", "wandb", "lightning_logs",
    "mlruns", ".DS_Store", MANIFEST)


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # relative, with /
    size: int
    sha256: str
    executable: bool

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "executable": self.executable}


def snapshot_id(files: Iterable[SnapshotFile]) -> str:
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{int(f.executable)}\0{f.sha256}\n".encode())
    return digest.hexdigest()[:16]


def manifest(files: list[SnapshotFile], source: str, git: dict[str, Any] | None, created: str) -> dict[str, Any]:
    return {"format": FORMAT, "id": snapshot_id(files), "created": created, "source": source, "git": git,
            "files": [f.to_json() for f in sorted(files, key=lambda f: f.path)]}


def git_state_key(git: dict[str, Any]) -> str:
    """The name of a git state's file under GIT_STATES: the first 16 hex digits of its JSON's SHA-256."""
    return hashlib.sha256(json.dumps(git, sort_keys=True).encode()).hexdigest()[:16]


def _git_of(here: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The git state this launch was made from: the one GIT_STATE_ENV names (unknown when it can't be read), else the
    manifest's (a launch on the login node itself, of a snapshot made there)."""
    key = os.environ.get(GIT_STATE_ENV, "")
    if not key:
        return data.get("git") or {}
    try:
        state = json.loads((here / GIT_STATES / f"{key}.json").read_text())
    except (OSError, ValueError):
        state = None
    # Named but unreadable (its write failed): unknown, never the manifest's, which may be another commit's.
    return state if isinstance(state, dict) else {"commit": None, "dirty": None, "diff": ""}


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of the snapshot DIRECTORY is, or None (not a snapshot, or an unreadable one)."""
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def snapshot_record(launch_dir: str | None = None) -> dict[str, Any] | None:
    """What a run directory records of the snapshot it was launched from: {"id", "path", "git_commit",
    "git_dirty", "source"}; None when the launcher runs outside a snapshot (on the user's own checkout)."""
    here = Path(launch_dir or os.getcwd())
    data = read_manifest(here)
    if data is None:
        return None
    git = _git_of(here, data)
    return {"id": data.get("id"), "path": str(here), "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
            "source": data.get("source")}


def snapshot_diff(launch_dir: str | None = None) -> str:
    """The snapshot's uncommitted changes (git diff HEAD) as taken, '' when none or not a snapshot."""
    here = Path(launch_dir or os.getcwd())
    data = read_manifest(here)
    return str(_git_of(here, data).get("diff") or "") if data is not None else ""


def manifest_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The files one snapshot's manifest has otherwise than another's: 'PATH' (changed), 'PATH (new)',
    'PATH (removed)', in path order."""
    def files(data: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        return {str(f.get("path")): (f.get("sha256"), f.get("executable")) for f in data.get("files") or []
                if isinstance(f, dict)}

    before, after = files(old), files(new)
    out = []
    for path in sorted(set(before) | set(after)):
        if path not in before:
            out.append(f"{path} (new)")
        elif path not in after:
            out.append(f"{path} (removed)")
        elif before[path] != after[path]:
            out.append(path)
    return out


def current_snapshot_id(launch_dir: str | None = None) -> str | None:
    """The id of the snapshot the launcher (or a rank) runs in; None outside one."""
    data = read_manifest(Path(launch_dir or os.getcwd()))
    return str(data["id"]) if data is not None and data.get("id") else None

