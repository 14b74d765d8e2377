"""The project directory as a content-addressed snapshot (contract/remote_snapshot.py): which files, their hashes,
the size limit, and the copy with rsync over the open connection (only when the cluster lacks that snapshot).

A git work tree ships its tracked files plus the untracked ones git does not ignore; any other directory ships
every file less DEFAULT_EXCLUDE. Secrets (SECRET_EXCLUDE), bytecode and remote.exclude are left out of both.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.config.remote import RemoteConfig
from contract.errors import ConfigError
from contract.remote_snapshot import (
    BYTECODE,
    DEFAULT_EXCLUDE,
    GIT_STATE_ENV,
    GIT_STATES,
    MANIFEST,
    OUTPUTS,
    SECRET_EXCLUDE,
    SNAPSHOTS,
    SnapshotFile,
    git_state_key,
    manifest,
)
from launcher.run.remote.ssh import Connection

MB = 1024 * 1024
RSYNC_SIGNALLED = 20  # rsync's exit code when a SIGINT, SIGTERM or SIGHUP stopped it


@dataclass
class Snapshot:
    project: Path
    files: list[SnapshotFile]
    git: dict[str, Any] | None
    manifest: dict[str, Any]
    # Files (or a directory, NAME/) left out as secrets that would have been shipped otherwise.
    withheld: list[str] = field(default_factory=list)
    # The git work tree's top when the project is a directory below it: only the project is shipped.
    git_top: Path | None = None

    @property
    def id(self) -> str:
        return str(self.manifest["id"])

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def take(project: Path, remote: RemoteConfig) -> Snapshot:
    """Hash the project's files; a project over remote.max_snapshot_mb is refused, naming what made it big."""
    git = _git_files(project)
    excluded = (SECRET_EXCLUDE + BYTECODE + (MANIFEST, OUTPUTS) if git is not None else DEFAULT_EXCLUDE) + tuple(
        remote.exclude)
    secret_dirs: list[str] = []
    paths = git if git is not None else _walk(project, excluded, secret_dirs)
    kept = sorted(p for p in paths if not _excluded(p, excluded))
    withheld = secret_dirs + [p for p in paths if _excluded(p, SECRET_EXCLUDE)]
    sizes = {p: (project / p).lstat().st_size for p in kept if (project / p).is_file() or (project / p).is_symlink()}
    _check_size(project, sizes, remote)
    files = [_file(project, p) for p in sizes]
    git_info = _git_state(project, set(sizes)) if git is not None else None
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # The manifest names no commit: the same files are launched again at other commits (it named the first launch's,
    # a stale label); each launch's state is written beside it (record_git_state).
    return Snapshot(project, files, git_info, manifest(files, str(project), None, created),
                    _secret_names(withheld), _git_top(project) if git is not None else None)


def _secret_names(paths: list[str]) -> list[str]:
    """Each withheld path as its first part that is a secret: `.ssh/` for everything under it."""
    names: dict[str, None] = {}
    for path in paths:
        parts = path.rstrip("/").split("/")
        at = next((i for i, part in enumerate(parts) if _excluded(part, SECRET_EXCLUDE)), len(parts) - 1)
        names["/".join(parts[: at + 1]) + ("/" if at < len(parts) - 1 or path.endswith("/") else "")] = None
    return sorted(names)


def _commit_text(git: dict[str, Any] | None) -> str:
    if git is None:
        return ""
    commit = str(git.get("commit") or "")[:12] or "no commit yet"
    return f" (commit {commit}{', with uncommitted changes' if git.get('dirty') else ''})"


def _git_top(project: Path) -> Path | None:
    top = _git(project, "rev-parse", "--show-toplevel").stdout.strip()
    return Path(top) if top and Path(top).resolve() != project.resolve() else None


def copy_line(name: str, host: str, snap: Snapshot, copied: bool) -> str:
    """What a launch says of its snapshot: copied or already there, the secrets withheld, and, from a directory
    below a git work tree's top, that only it is shipped."""
    what = (f"copied to {host} ({len(snap.files)} file{'' if len(snap.files) == 1 else 's'}, {size_text(snap.size)})" if copied
            else f"already on {host}, not copied")
    line = f"remote {name}: snapshot {snap.id}{_commit_text(snap.git)} {what}"
    if snap.withheld:
        shown = snap.withheld[:6] + ([f"{len(snap.withheld) - 6} more"] if len(snap.withheld) > 6 else [])
        line += f"; secrets withheld: {', '.join(shown)}"
    if snap.git_top is not None:
        line += (f"\nremote {name}: only {snap.project} is shipped, the directory this command was typed in, not the "
                 f"git work tree {snap.git_top} above it: a module, config or data path outside it is not on the "
                 f"cluster; run from {snap.git_top} to ship it all")
    return line


def _excluded(path: str, patterns: tuple[str, ...]) -> bool:
    parts = path.split("/")
    return any(fnmatch.fnmatch(path, pat) or any(fnmatch.fnmatch(part, pat) for part in parts) for pat in patterns)


def _walk(project: Path, excluded: tuple[str, ...], secret_dirs: list[str]) -> list[str]:
    """Every file below PROJECT, less the excluded directories; those excluded as secrets are put in SECRET_DIRS."""
    found: list[str] = []
    for root, dirs, names in os.walk(project):
        rel = Path(root).relative_to(project)
        secret_dirs += [(rel / d).as_posix() + "/" for d in dirs if _excluded((rel / d).as_posix(), SECRET_EXCLUDE)]
        dirs[:] = [d for d in dirs if not _excluded((rel / d).as_posix(), excluded)]
        found += [(rel / n).as_posix() for n in names]
    return found


def _git(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=False)


def _git_files(project: Path) -> list[str] | None:
    """Tracked files plus untracked ones git does not ignore, below PROJECT; None outside a git work tree."""
    try:
        inside = _git(project, "rev-parse", "--is-inside-work-tree")
    except OSError:
        return None
    if inside.returncode or inside.stdout.strip() != "true":
        return None
    out = _git(project, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return [p for p in dict.fromkeys(out.stdout.split("\0")) if p]


def _git_state(project: Path, shipped: set[str]) -> dict[str, Any]:
    """The commit and the uncommitted changes of what is shipped: `git diff HEAD`, and whether untracked files
    (shipped, but in no diff) make it differ from the commit too."""
    commit = _git(project, "rev-parse", "HEAD").stdout.strip() or None
    # The diff of shipped files only: a tracked .env's change (old and new secret) was written into the snapshot's
    # manifest and the run's snapshot.diff.
    changed = _git(project, "diff", "HEAD", "--name-only", "-z", "--relative", "--", ".").stdout.split("\0") if commit else []
    diffed = sorted(p for p in changed if p in shipped)
    diff = _git(project, "diff", "HEAD", "--relative", "--", *diffed).stdout if diffed else ""
    untracked = set(_git(project, "ls-files", "-z", "--others", "--exclude-standard").stdout.split("\0")) & shipped
    return {"commit": commit, "dirty": bool(diff or untracked or not commit), "diff": diff}


def _file(project: Path, rel: str) -> SnapshotFile:
    path = project / rel
    if path.is_symlink():  # shipped as the link it is (rsync -l): its target text is its content
        target = os.readlink(path).encode()
        return SnapshotFile(rel, len(target), hashlib.sha256(b"link:" + target).hexdigest(), False)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MB), b""):
            digest.update(block)
    stat = path.stat()
    return SnapshotFile(rel, stat.st_size, digest.hexdigest(), bool(stat.st_mode & 0o111))


def _check_size(project: Path, sizes: dict[str, int], remote: RemoteConfig) -> None:
    total = sum(sizes.values())
    if total <= remote.max_snapshot_mb * MB:
        return
    by_top: Counter[str] = Counter()
    for path, size in sizes.items():
        top, _, rest = path.partition("/")
        by_top[top + ("/" if rest else "")] += size
    biggest = ", ".join(f"{name} ({size_text(size)})" for name, size in by_top.most_common(3))
    raise ConfigError(f"the project directory {project} is {size_text(total)}, over remote.max_snapshot_mb="
                      f"{remote.max_snapshot_mb:g}: most of it is {biggest}; leave data and checkpoints out (a "
                      ".gitignore entry or remote.exclude) and point data.path at the cluster's copy, or raise "
                      "remote.max_snapshot_mb")


def size_text(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def rsync(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["rsync", "-rlpt", "-s", *args], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, check=False)
    except OSError as err:
        raise ConfigError(f"rsync can't run here ({err.strerror}): install it (apt install rsync, brew install "
                          "rsync); the login node needs it too") from None


def rsync_said(stderr: str) -> str:
    """rsync's first complaint (its last line only says that there were some)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("rsync:")), lines[-1] if lines else "no message")


def ship(snapshot: Snapshot, conn: Connection, remote: RemoteConfig, like: str = "") -> None:
    """rsync the files into WORKDIR/snapshots/.incoming-ID-PID, write the manifest, link outputs, and move it to
    WORKDIR/snapshots/ID in one rename (a snapshot that another copy finished first is kept, ours dropped).
    LIKE, an earlier snapshot there (its absolute path): the files it has unchanged (size and time) are hard links
    to its own, not sent again."""
    snaps = f"{remote.workdir.rstrip('/')}/{SNAPSHOTS}"
    incoming = f".incoming-{snapshot.id}-{os.getpid()}"
    with tempfile.NamedTemporaryFile("wb", suffix=".files") as listing:
        listing.write(b"\0".join(f.path.encode() for f in snapshot.files))
        listing.flush()
        # -s: paths with spaces survive the remote shell; -rlpt: no owner or group (the cluster's user owns it).
        # Whole files (-W): rsync 3.2.7's deltas against a --link-dest basis failed their own verification here.
        link = ["-W", f"--link-dest={like}"] if like else []
        try:
            out = rsync([*link, "--from0", f"--files-from={listing.name}", "-e", conn.rsync_shell(),
                         f"{snapshot.project}/", f"{remote.host}:{snaps}/{incoming}/"])
        except KeyboardInterrupt:
            out = None
    if out is None or out.returncode == RSYNC_SIGNALLED:  # Ctrl-C: it blamed rsync and left the part copied there
        _drop(conn, f"{snaps}/{incoming}")
        raise KeyboardInterrupt
    if out.returncode:
        said = rsync_said(out.stderr)
        raise ConfigError(f"copying the project to {remote.host}:{snaps} failed ({said}): check that rsync is "
                          "installed there and that remote.workdir is writable")
    q = shlex.quote
    finish = (f"cd {q(snaps)} && cat > {q(incoming)}/{MANIFEST} && ln -sfn ../../{OUTPUTS} {q(incoming)}/{OUTPUTS} "
              f"&& if [ -e {q(snapshot.id)}/{MANIFEST} ]; then rm -rf {q(incoming)}; "
              f"else rm -rf {q(snapshot.id)} && mv -T {q(incoming)} {q(snapshot.id)}; fi"
              # copies that broke off half-way (a day old: none still running) are dropped
              " && find . -maxdepth 1 -name '.incoming-*' -mmin +1440 -exec rm -rf {} +")
    done = conn.run(finish, capture=True, stdin=json.dumps(snapshot.manifest, indent=1) + "\n")
    if done.returncode:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"the snapshot {snapshot.id} could not be completed on {remote.host} ({said}): check "
                          "that remote.workdir is writable")


def _drop(conn: Connection, path: str) -> None:
    """Remove a half-made copy on the login node after a Ctrl-C (a second one does not stop it: 30 s at most)."""
    q = shlex.quote(path)
    script = f"cd && for i in 1 2 3 4 5; do rm -rf {q} 2>/dev/null; [ -e {q} ] || break; sleep 1; done"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        subprocess.run(conn.command(script), stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        signal.signal(signal.SIGINT, previous)


def record_git_state(snapshot: Snapshot, conn: Connection, remote: RemoteConfig) -> dict[str, str]:
    """A snapshot's manifest holds the git state of the launch that shipped it; the same files launched at another
    commit (one that changed no shipped file) are the same snapshot. This launch's state goes into
    ID/GIT_STATES/KEY.json, and the environment returned (GIT_STATE_ENV=KEY) makes the run record it
    (contract/remote_snapshot.py); unwritten, the run records the commit as unknown, never another launch's."""
    assert snapshot.git is not None
    key = git_state_key(snapshot.git)
    q = shlex.quote
    where = f"{remote.workdir.rstrip('/')}/{SNAPSHOTS}/{snapshot.id}/{GIT_STATES}"
    script = (f"cd && mkdir -p {q(where)} && cd {q(where)} && cat > .{key}.$$ && mv -f .{key}.$$ {key}.json")
    done = conn.run(script, capture=True, stdin=json.dumps(snapshot.git) + "\n")
    if done.returncode:  # another user's snapshot in a shared workdir, a full quota: the run goes ahead
        said = (done.stderr.strip().splitlines() or ["no message"])[-1].strip()
        print(f"remote {remote.name}: this launch's commit could not be written beside snapshot {snapshot.id} "
              f"({said}): its run records the commit as unknown", file=sys.stderr)
    return {GIT_STATE_ENV: key}
