"""`python -m launcher ... +remote=NAME`: the same command (dry runs, plans, sweeps with -m, searches) run on the
login node, in the snapshot of the project directory it was typed in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from contract.errors import EXIT_BAD_INPUT, ConfigError
from launcher.run.remote import config, hints, snapshot
from launcher.run.remote.session import Session


def forward(argv: list[str]) -> int | None:
    """Run ARGV on the remote it names; None when it names none (the command runs here)."""
    try:
        args = config.split_args(argv)
        if args is None:
            return None
        remote = config.load(args.name, args.config_dir, args.overrides)
        project = Path.cwd()
        rest = _relative_config_dir(args.rest, project)
        snap = snapshot.take(project, remote)  # the size limit before any login
        session = Session.open(remote)
        present = session.check(snap.id)
        if present:
            print(f"remote {remote.name}: snapshot {snap.id} already on {remote.host}, not copied", file=sys.stderr)
        else:
            like = session.newest_snapshot and f"{session.workdir_abs}/{snapshot.SNAPSHOTS}/{session.newest_snapshot}"
            snapshot.ship(snap, session.conn, remote, like=like)
            print(f"remote {remote.name}: snapshot {snap.id} copied to {remote.host} ({len(snap.files)} files, "
                  f"{snapshot.size_text(snap.size)})", file=sys.stderr)
        # The same files may have been shipped at another commit (or by a copy that finished first): the run
        # records this launch's.
        env = snapshot.record_git_state(snap, session.conn, remote) if snap.git is not None else {}
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    env.update(hints.origin_env(remote.name, args.config_dir, args.overrides, session.workdir_abs))  # hints for here
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    code, _ = session.run_python("launcher", rest, cwd_below=(snapshot.SNAPSHOTS, snap.id), tty=tty, env=env)
    return code


def _relative_config_dir(args: list[str], project: Path) -> list[str]:
    """A --config-dir given as an absolute path inside the project becomes relative (the snapshot has it there);
    one outside the project would not be on the cluster: refused."""
    out = list(args)
    for i, arg in enumerate(out):
        flag, value = None, None
        if arg in ("--config-dir", "-cd") and i + 1 < len(out):
            flag, value = i + 1, out[i + 1]
        elif arg.startswith("--config-dir="):
            flag, value = i, arg.split("=", 1)[1]
        if value is None or flag is None:
            continue
        path = Path(os.path.expanduser(value))
        rel = os.path.relpath(path if path.is_absolute() else project / path, project)
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ConfigError(f"--config-dir {value} is outside the project directory {project}, which is all the "
                              "cluster gets: move it into the project, or run from its parent")
        out[flag] = rel if flag != i else f"--config-dir={rel}"
    return out
