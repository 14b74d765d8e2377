"""`python -m launcher ... +remote=NAME`: the same command (dry runs, plans, sweeps with -m, searches) run on the
login node, in the snapshot of the project directory it was typed in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from contract.errors import EXIT_BAD_INPUT, EXIT_KILLED, ConfigError
from launcher.run.remote import config, hints, snapshot
from launcher.run.remote.session import Session


def forward(argv: list[str]) -> int | None:
    """Run ARGV on the remote it names; None when it names none (the command runs here)."""
    stage = "before logging in"
    try:
        args = config.split_args(argv)
        if args is None:
            return None
        remote = config.load(args.name, args.config_dir, args.overrides)
        project = Path.cwd()
        rest = _relative_config_dir(args.rest, project)
        snap = snapshot.take(project, remote)  # the size limit before any login
        session = Session.open(remote)
        stage = f"while checking the login node of remote {remote.name}"
        present = session.check(snap.id)
        if not present:
            stage = f"while copying the project to {remote.host} (the part copied there is removed)"
            like = session.newest_snapshot and f"{session.workdir_abs}/{snapshot.SNAPSHOTS}/{session.newest_snapshot}"
            snapshot.ship(snap, session.conn, remote, like=like)
        print(snapshot.copy_line(remote.name, remote.host, snap, copied=not present), file=sys.stderr)
        stage = f"before the command ran on {remote.host}"
        # The same files may have been shipped at another commit (or by a copy that finished first): the run
        # records this launch's.
        env = snapshot.record_git_state(snap, session.conn, remote) if snap.git is not None else {}
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # it blamed rsync (whose exit code the copy then read), and left the copy there
        print(f"launcher: interrupted (Ctrl-C) {stage}: nothing was submitted; run the same command again",
              file=sys.stderr)
        return EXIT_KILLED
    env.update(hints.origin_env(remote.name, args.config_dir, args.overrides, session.workdir_abs))  # hints for here
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    code, _ = session.run_python("launcher", rest, cwd_below=(snapshot.SNAPSHOTS, snap.id), tty=tty, env=env)
    if code and code != EXIT_KILLED and snap.git_top is not None:  # the error above may be a file left behind
        print(f"remote {remote.name}: note: only {snap.project} was shipped, not the git work tree {snap.git_top} "
              "above it: if the error names a module or file outside it, run from there", file=sys.stderr)
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
