"""+remote's launch without a login node: what the snapshot line says (the commit, the secrets withheld, a project
below a git work tree's top), and, through a login node that is a shell on this machine (the real sshd:
tests/slurm/test_remote.py), bytecode kept out of a snapshot and a Ctrl-C during the copy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from contract.config.remote import RemoteConfig
from launcher.run.remote import snapshot
from launcher.run.remote.session import Session
from launcher.run.remote.ssh import Connection
from tests.conftest import ROOT

GIT = ["-c", "user.email=t@e", "-c", "user.name=t"]


def _git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(project), *GIT, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _project(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.py").write_text("x = 1\n")
    (root / "sub" / "train.py").write_text("y = 1\n")
    (root / ".env").write_text("TOKEN=secret\n")
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_rsa").write_text("k")
    (root / "notes.pem").write_text("p")
    _git(root, "init", "-q")
    _git(root, "add", "-f", "model.py", "sub/train.py", ".env")
    _git(root, "commit", "-qm", "first")
    return root


def test_the_snapshot_line_names_the_commit_the_secrets_withheld_and_what_was_not_shipped(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj")
    remote = RemoteConfig(name="r", host="login")
    snap = snapshot.take(project, remote)
    # the secrets left out were not named (a tracked .env, an untracked key, a .ssh directory)
    assert snap.withheld == [".env", ".ssh/", "notes.pem"]
    line = snapshot.copy_line("r", "login", snap, copied=True)
    assert line.startswith(f"remote r: snapshot {snap.id} (commit {_git(project, 'rev-parse', 'HEAD')[:12]}) copied "
                           "to login (2 files, ")
    assert line.endswith("; secrets withheld: .env, .ssh/, notes.pem")
    # A commit that changes no shipped file is the same snapshot: its manifest named the first launch's commit and
    # diff (written once, it went stale); each launch's state is written beside it and named on its line.
    (project / "model.py").write_text("x = 2\n")
    dirty = snapshot.take(project, remote)
    assert "with uncommitted changes" in snapshot.copy_line("r", "login", dirty, copied=True)
    _git(project, "commit", "-qam", "the edit")
    clean = snapshot.take(project, remote)
    assert clean.id == dirty.id and clean.git != dirty.git
    assert "git" not in json.dumps(clean.manifest["git"] or {}) and clean.manifest["git"] is None
    assert f"(commit {_git(project, 'rev-parse', 'HEAD')[:12]}) already on login" in \
        snapshot.copy_line("r", "login", clean, copied=False)
    # From a subdirectory only it is shipped: said, with the directory to run from
    sub = snapshot.take(project / "sub", remote)
    assert [f.path for f in sub.files] == ["train.py"]
    said = snapshot.copy_line("r", "login", sub, copied=True).splitlines()[1]
    assert said == (f"remote r: only {project / 'sub'} is shipped, the directory this command was typed in, not the "
                    f"git work tree {project} above it: a module, config or data path outside it is not on the "
                    f"cluster; run from {project} to ship it all")
    assert len(snapshot.copy_line("r", "login", snap, copied=True).splitlines()) == 1  # from the top: no note
    # outside git: the secret directory is named, not walked
    plain = tmp_path / "plain"
    shutil.copytree(project, plain, ignore=shutil.ignore_patterns(".git"))
    assert snapshot.take(plain, remote).withheld == [".env", ".ssh/", "notes.pem"]


_LOGIN_HERE = """
from launcher.run.remote.ssh import Connection


class ShellHere(Connection):
    '''The login node as a shell on this machine, its home HOME: the same scripts, without ssh.'''

    def open(self):
        pass

    def is_open(self):
        return True

    def command(self, script, tty=False):
        return ["bash", "-c", script]

    def rsync_shell(self):
        return FAKE_SSH
"""


def _login_here(tmp_path: Path) -> tuple[RemoteConfig, type[Connection], dict[str, str]]:
    """A remote whose login node is a shell here (HOME is its home), and the Connection class that reaches it."""
    fake_ssh = tmp_path / "bin" / "fake-ssh"
    fake_ssh.parent.mkdir(parents=True, exist_ok=True)
    fake_ssh.write_text('#!/bin/sh\nshift\ncd && exec "$@"\n')  # `ssh HOST COMMAND...`: the command, in HOME
    fake_ssh.chmod(0o755)
    scope: dict[str, object] = {"FAKE_SSH": str(fake_ssh)}
    exec(_LOGIN_HERE, scope)  # noqa: S102 - the class is also written into a driver script below
    remote = RemoteConfig(name="here", host="login", workdir=str(tmp_path / "work"), python=sys.executable,
                          setup=[f"export PYTHONPATH={ROOT}"])
    return remote, scope["ShellHere"], {"HOME": str(tmp_path / "home"), "FAKE_SSH": str(fake_ssh)}  # type: ignore


def test_a_remote_command_writes_no_bytecode_into_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote dry run wrote __pycache__ into the snapshot, a directory named by the hash of its content."""
    remote, shell_here, env = _login_here(tmp_path)
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # a login node writes bytecode
    Path(env["HOME"]).mkdir()
    snap = tmp_path / "work" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "importer.py").write_text("import helper\nprint('imported', helper.X)\n")
    (snap / "helper.py").write_text("X = 7\n")
    session = Session(remote, shell_here(remote))
    code, out = session.run_python("importer", [], cwd_below=("snapshots", "abc"), capture=True)
    assert code == 0 and "imported 7" in out
    assert not list(snap.rglob("__pycache__")) and not list(snap.rglob("*.pyc"))
    assert list((tmp_path / "work" / ".pycache").rglob("helper*.pyc"))  # still cached, beside the snapshots


_DRIVER = """
import sys
from launcher.run.remote import launch
from launcher.run.remote.session import Session
{login_here}
launch.Session.open = classmethod(lambda cls, remote: cls(remote, ShellHere(remote)))
sys.exit(launch.forward(sys.argv[1:]))
"""


def test_ctrl_c_during_the_copy_is_one_line_and_leaves_no_partial_copy(tmp_path: Path) -> None:
    """It printed rsync's complaint ("check that rsync is installed there") and left .incoming-* on the login node."""
    remote, _, env = _login_here(tmp_path)
    Path(env["HOME"]).mkdir()
    project = tmp_path / "project"
    (project / "conf" / "remote").mkdir(parents=True)
    (project / "conf" / "remote" / "here.yaml").write_text(json.dumps({
        "host": "login", "workdir": remote.workdir, "python": sys.executable, "setup": remote.setup}))
    (project / "big.bin").write_bytes(os.urandom(400_000))
    # rsync, slowed down here (not its server end) so that the copy is under way when Ctrl-C comes
    real = shutil.which("rsync")
    assert real is not None
    slow = tmp_path / "bin" / "rsync"
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" --server "*) exec {real} "$@";; esac\n'
                    f'exec {real} --bwlimit=20 "$@"\n')
    slow.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER.format(login_here=textwrap.dedent(_LOGIN_HERE).replace(
        "FAKE_SSH\n", repr(env["FAKE_SSH"]) + "\n")))
    child_env = {**os.environ, **env, "PATH": f"{slow.parent}{os.pathsep}{os.environ['PATH']}",
                 "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(driver), "--config-dir", "conf", "+remote=here",
                             "launcher.dry_run=true"], cwd=project, env=child_env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    snaps = tmp_path / "work" / "snapshots"
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(".incoming-") and (p / "big.bin").exists() or
                  any(p.glob(".big.bin.*")) for p in snaps.glob(".incoming-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "launcher: interrupted (Ctrl-C) while copying the project to login (the part copied there is removed): "
        "nothing was submitted; run the same command again"], err
    assert list(snaps.iterdir()) == []
