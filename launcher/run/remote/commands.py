"""`python -m launcher.status|report|sample|export|evaluate` with `+remote=NAME` (or a `NAME:PATH` argument): the
command runs on the login node, in the remote's work directory (where `outputs/` is the runs' root), and what a
person looks at lands here: the table or text on this terminal, the report's PNGs and an export with --pull under
the same relative path in this directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.remote_snapshot import SNAPSHOTS
from launcher.run.remote import config
from launcher.run.remote.session import Session
from launcher.run.remote.snapshot import rsync, rsync_said

# What each command brings back: the files it prints (report: one PNG a line) or the path it prints last (export).
_PULLED_ALWAYS = {"launcher.report"}
_PULL_FLAG = "--pull"
# Commands that build a run's model: its snapshot's modules must import (a project's own model.py).
_RUN_CODE = {"launcher.export", "launcher.sample", "launcher.evaluate"}


def forward(module: str, argv: list[str]) -> int | None:
    """Run `python -m MODULE ARGV` on the remote ARGV names; None when it names none (the command runs here)."""
    try:
        found = _remote_args(argv)
        if found is None:
            return None
        name, args, config_dir, overrides = found
        pull = _PULL_FLAG in args
        args = [a for a in args if a != _PULL_FLAG]
        if pull and module != "launcher.export":
            raise ConfigError(f"--pull brings back an export: drop it from {module}")
        remote = config.load(name, config_dir, overrides)
        session = Session.open(remote)
        session.check()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    capture = module in _PULLED_ALWAYS or pull
    code, stdout = session.run_python(module, args, capture=capture, run_code=module in _RUN_CODE,
                                      tty=not capture and sys.stdin.isatty() and sys.stdout.isatty())
    if code or not capture:
        return code
    printed = [line.strip() for line in stdout.splitlines() if line.strip()]
    wanted = [p for p in printed if p.endswith(".png")] if module in _PULLED_ALWAYS else printed[-1:]
    for path in wanted:
        local = _local_path(path, session.workdir_abs)
        try:
            if not _fetch(session, path, local):
                return 1
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"here: {local}")
    return 0


def _remote_args(argv: list[str]) -> tuple[str, list[str], str | None, list[str]] | None:
    """(name, the command's own arguments, --config-dir, remote.KEY=VALUE overrides), or None for a local command."""
    name, rest, config_dir, overrides = None, [], None, []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith(("+remote=", "remote=")):
            name = arg.split("=", 1)[1]
        elif config.is_override(arg) and "=" in arg:
            overrides.append(config.override_text(arg))
        elif arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            config_dir, skip = argv[i + 1], True
        elif arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if name is None:  # NAME:PATH, when NAME is a remote and PATH is not a local path
        for i, arg in enumerate(rest):
            head, sep, tail = arg.partition(":")
            if sep and head and not arg.startswith("-") and "/" not in head and not Path(arg).exists():
                try:
                    config.yaml_path(head, config_dir)
                except ConfigError:
                    continue
                name, rest[i] = head, tail or "."
    if name is None:
        if overrides or config_dir:
            raise ConfigError("remote.KEY=VALUE and --config-dir apply to a remote: add +remote=NAME")
        return None
    return name, rest, config_dir, overrides


def _local_path(remote_path: str, workdir_abs: str) -> Path:
    """Where a file the remote printed lands here: a path below the work directory (or a snapshot's outputs/) under
    the same relative path in this directory; any other absolute path under its parent directory's name."""
    path = Path(remote_path)
    if path.is_absolute():
        if workdir_abs and path.is_relative_to(workdir_abs):
            path = path.relative_to(workdir_abs)
        else:
            path = Path(path.parent.name) / path.name
    parts = path.parts
    if len(parts) > 2 and parts[0] == SNAPSHOTS:  # snapshots/ID/outputs/... is WORKDIR/outputs/...
        path = Path(*parts[2:])
    return Path.cwd() / path


def _fetch(session: Session, remote_path: str, local: Path) -> bool:
    src = remote_path if os.path.isabs(remote_path) else f"{session.workdir_abs}/{remote_path}"
    local.parent.mkdir(parents=True, exist_ok=True)
    out = rsync(["-e", session.conn.rsync_shell(), f"{session.remote.host}:{src}", str(local.parent) + "/"])
    if out.returncode:
        said = rsync_said(out.stderr)
        print(f"error: bringing {src} back from {session.remote.host} failed ({said})", file=sys.stderr)
    return out.returncode == 0


def forward_or_none(module: str, argv: list[str] | None) -> int | None:
    """The commands' hook: their main(argv) calls this first."""
    return forward(module, sys.argv[1:] if argv is None else argv)
