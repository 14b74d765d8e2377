"""A remote command's session: log in once, check slurmtrain on the cluster (present, same version), ship the
project's snapshot when one is asked for and missing, and run the command there with its output streamed here."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from importlib import metadata

from contract.config.remote import RemoteConfig
from contract.errors import ConfigError
from contract.remote_snapshot import MANIFEST, OUTPUTS, SNAPSHOTS
from launcher.run.remote.ssh import SSH_FAILED, Connection

_SETUP_OK, _HAVE, _VERSION, _WORKDIR = "@slurmtrain-setup-ok", "@slurmtrain-have-snapshot", "@slurmtrain-version", \
    "@slurmtrain-workdir"
_NEWEST = "@slurmtrain-newest-snapshot"
_NO_WORKDIR = "@slurmtrain-no-workdir"  # its mkdir failed (before the setup's set -e)
_PROBE = ("import importlib.metadata as m, launcher, contract.config.schema\n"
          "try:\n    v = m.version('slurmtrain')\nexcept m.PackageNotFoundError:\n    v = 'unknown'\n"
          f"print({_VERSION!r}, v)\n")
MISSING_PYTHON = 127
PYCACHE = ".pycache"  # under the work directory: the bytecode of the snapshots' modules
# The snapshot a run was launched from (its environment.json), for each argument that is a run or checkpoint dir.
_RUN_SNAPSHOT = ("import json, sys\nfrom pathlib import Path\nfor a in sys.argv[1:]:\n"
                 "    for d in (Path(a), Path(a).parent.parent):\n        try:\n"
                 "            s = json.loads((d / 'environment.json').read_text()).get('snapshot') or {}\n"
                 "        except (OSError, ValueError):\n            continue\n"
                 "        if s.get('path'):\n            print(s['path'])\n            sys.exit()\n")


def local_version() -> str:
    try:
        return metadata.version("slurmtrain")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class Session:
    remote: RemoteConfig
    conn: Connection
    workdir_abs: str = ""
    newest_snapshot: str = ""  # the last one copied there: a new snapshot hard-links its unchanged files

    @classmethod
    def open(cls, remote: RemoteConfig) -> Session:
        conn = Connection(remote)
        conn.open()
        return cls(remote, conn)

    def _prelude(self) -> str:
        """The setup commands (run from the remote user's home, as a login starts), `set -e`: a failing one stops."""
        return "\n".join(["set -e", *self.remote.setup])

    def _cd(self, *below: str) -> str:
        path = "/".join([self.remote.workdir.rstrip("/"), *below])
        return f"cd && cd {shlex.quote(path)}"

    def check(self, snapshot_id: str | None = None) -> bool:
        """slurmtrain is on the cluster at our version (else one line, exit 2); whether the snapshot is there."""
        q = shlex.quote
        wd = self.remote.workdir.rstrip("/")
        script = "\n".join([
            f"cd && mkdir -p {q(wd + '/' + SNAPSHOTS)} {q(wd + '/' + OUTPUTS)} || echo {_NO_WORKDIR}",
            self._prelude(), f"echo {_SETUP_OK}", self._cd(), f"echo {_WORKDIR} \"$(pwd)\"",
            *([f"if [ -e {q(SNAPSHOTS + '/' + snapshot_id + '/' + MANIFEST)} ]; then echo {_HAVE}; fi",
               f"echo {_NEWEST} \"$(ls -t {SNAPSHOTS} | head -n 1)\""] if snapshot_id else []),
            f"{q(self.remote.python)} -c {q(_PROBE)}"])
        out = self.conn.run(script, capture=True)
        said = {key: value for key, _, value in (line.partition(" ") for line in out.stdout.splitlines())
                if key.startswith("@slurmtrain-")}
        last_err = (out.stderr.strip().splitlines() or ["no message"])[-1].strip()
        name = self.remote.name
        if out.returncode == SSH_FAILED and _SETUP_OK not in said:
            raise ConfigError(self.conn.failure(out.stderr))
        if _SETUP_OK not in said:
            raise ConfigError(f"the setup commands of remote {name} failed on its login node ({last_err}): fix "
                              "remote.setup, then try them in `" + self.conn.where + "`")
        if _NO_WORKDIR in said or _WORKDIR not in said:  # it was reported as 'slurmtrain is missing (cd: ...)'
            raise ConfigError(f"remote.workdir={self.remote.workdir} can't be created on the login node of remote "
                              f"{name} ({last_err}): give a directory you can write there (relative: under your "
                              "home)")
        self.workdir_abs = said.get(_WORKDIR, "")
        self.newest_snapshot = said.get(_NEWEST, "").strip()
        if _VERSION not in said:
            if out.returncode == MISSING_PYTHON:
                raise ConfigError(f"there is no {self.remote.python!r} on the login node of remote {name} after "
                                  f"its setup ({last_err}): set remote.python, or a remote.setup that provides it")
            raise ConfigError(f"slurmtrain is missing on the login node of remote {name}: {self.remote.python} "
                              f"can't import it after the setup ({last_err}): install slurmtrain=={local_version()} "
                              "there, or set remote.setup (a venv's activate, a module load) and remote.python")
        theirs, ours = said[_VERSION].strip(), local_version()
        if theirs != ours:
            raise ConfigError(f"slurmtrain on the login node of remote {name} is version {theirs}, here it is "
                              f"{ours}: install slurmtrain=={ours} there (after remote.setup), or this one's "
                              "version here, so that both sides read the same config and run directories")
        return _HAVE in said

    def run_python(self, module: str, args: list[str], cwd_below: tuple[str, ...] = (), capture: bool = False,
                   tty: bool = False, run_code: bool = False, env: dict[str, str] | None = None) -> tuple[int, str]:
        """`PYTHON -m MODULE ARGS` in WORKDIR (or below it), after the setup, with ENV exported; its exit code and,
        with capture, its standard output (also echoed here as it comes). run_code: the snapshot of the run an
        argument names goes first on PYTHONPATH."""
        code_of_run = []
        if run_code:  # the run's own modules (a project's model.py) are importable as when it was launched
            find = shlex.join([self.remote.python, "-c", _RUN_SNAPSHOT, *args])
            code_of_run = [f"snap=$({find} 2>/dev/null) || snap=",
                           'if [ -n "$snap" ]; then export PYTHONPATH="$snap${PYTHONPATH:+:$PYTHONPATH}"; fi']
        exports = [f"export {key}={shlex.quote(value)}" for key, value in (env or {}).items()]
        # Bytecode goes to WORKDIR/.pycache, never into a snapshot (a directory named by the hash of its content):
        # the launcher, its probe and the jobs it submits (sbatch passes the environment on) import from there.
        pycache = [self._cd(), f'export PYTHONPYCACHEPREFIX="${{PYTHONPYCACHEPREFIX:-$PWD/{PYCACHE}}}"']
        script = "\n".join([self._prelude(), *pycache, self._cd(*cwd_below), *code_of_run, *exports,
                            "exec " + shlex.join([self.remote.python, "-m", module, *args])])
        if not capture:
            done = self.conn.run(script, tty=tty)
            return self._code(done.returncode, ""), ""
        done = self.conn.run(script, capture=True)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return self._code(done.returncode, done.stderr), done.stdout

    def _code(self, code: int, stderr: str) -> int:
        if code == SSH_FAILED and not self.conn.is_open():
            print(f"error: {self.conn.failure(stderr or 'the connection was lost')}", file=sys.stderr)
        return code
