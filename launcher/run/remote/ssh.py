"""The one connection to a remote's login node: the system `ssh`, sharing a ControlMaster socket.

The first command opens the master connection (the only login: a second factor is asked once), every later one
(rsync's included) rides on it until `control_persist` after the last. The user's ssh config is honoured: we add
only what it leaves unset (a ControlPath of its own is used as is); host keys are checked as ssh checks them, and a
password or a second factor is asked by ssh itself on the terminal, never read by us. No local environment
variable is sent beyond what the user's ssh config sends.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from contract.config.remote import RemoteConfig
from contract.errors import ConfigError

# Where the sockets live (a private directory): SLURMTRAIN_SSH_CONTROL_DIR, else $XDG_RUNTIME_DIR/slurmtrain-ssh,
# else ~/.cache/slurmtrain/ssh. ssh's %C (a hash of host, port and user) keeps the path short, as sockets need.
CONTROL_DIR_ENV = "SLURMTRAIN_SSH_CONTROL_DIR"
SSH_FAILED = 255

_UNREACHABLE = ("connection refused", "could not resolve hostname", "connection timed out", "no route to host",
                "network is unreachable", "operation timed out", "name or service not known",
                "kex_exchange_identification", "connection closed by", "connection reset")
_AUTH = ("permission denied", "too many authentication failures", "authentication failed")
_HOST_KEY = ("host key verification failed", "remote host identification has changed")



# Seconds ssh waits for a login node that does not answer (unless the user's ssh config sets ConnectTimeout).
CONNECT_TIMEOUT_S = 30

def control_dir() -> Path:
    chosen = os.environ.get(CONTROL_DIR_ENV)
    if chosen:
        path = Path(chosen)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "slurmtrain-ssh"
    else:
        path = Path.home() / ".cache" / "slurmtrain" / "ssh"
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)  # the socket is a logged-in session: nobody else may use it
    return path


@dataclass
class Connection:
    remote: RemoteConfig
    _base: list[str] | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """The login node as a person would type it to ssh."""
        return shlex.join(["ssh", *self._target_options(), self.remote.host])

    def _target_options(self) -> list[str]:
        r = self.remote
        args: list[str] = []
        if r.ssh_config:
            args += ["-F", os.path.expanduser(r.ssh_config)]
        if r.user:
            args += ["-l", r.user]
        if r.port:
            args += ["-p", str(r.port)]
        if r.jump:
            args += ["-J", r.jump]
        for key, value in r.ssh_options.items():
            args += ["-o", f"{key}={value}"]
        return args

    def _options(self) -> list[str]:
        """The options above plus a ControlMaster socket, unless the user's config has one of its own (`ssh -G`
        tells, without connecting)."""
        if self._base is None:
            options = self._target_options()
            resolved = _resolved_config([*options, self.remote.host])
            if resolved.get("controlpath", "none") == "none" or resolved.get("controlmaster", "false") == "false":
                options += ["-o", f"ControlPath={control_dir() / '%C'}",
                            "-o", f"ControlPersist={self.remote.control_persist}"]
            if resolved.get("connecttimeout", "none") == "none":  # a host that drops packets hung for minutes
                options += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
            self._base = options
        return self._base

    def base(self) -> list[str]:
        """`ssh OPTIONS` without the host, for every command: through the open master, never becoming one (a
        command that became the master would hold its captured output open for as long as the master lives)."""
        return ["ssh", *self._options(), "-o", "ControlMaster=no"]

    def open(self) -> None:
        """Log in once (or find the master already logged in); a failure is one line that says which."""
        if self.is_open():
            return
        with tempfile.TemporaryFile(mode="w+") as err:
            # -f: ssh goes to the background once logged in; its stderr is a file, not a pipe, which the
            # backgrounded master would hold open. Prompts (a passphrase, a second factor) go to the terminal.
            code = subprocess.run(["ssh", *self._options(), "-o", "ControlMaster=auto", "-f", "-N", self.remote.host],
                                  stdin=None if sys.stdin.isatty() else subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=err, check=False).returncode
            err.seek(0)
            message = err.read()
        if code:
            raise ConfigError(self.failure(message))

    def is_open(self) -> bool:
        return subprocess.run([*self.base(), "-O", "check", self.remote.host], stdin=subprocess.DEVNULL,
                              capture_output=True, check=False).returncode == 0

    def close(self) -> None:
        subprocess.run([*self.base(), "-O", "exit", self.remote.host], stdin=subprocess.DEVNULL,
                       capture_output=True, check=False)

    def failure(self, stderr: str) -> str:
        """ssh's own failure (exit 255) as one line naming the fix."""
        lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
        said = lines[-1] if lines else "no message"
        low = stderr.lower()
        name, try_ = self.remote.name, f"check that `{self.where} true` works"
        if any(s in low for s in _HOST_KEY):
            return (f"the login node of remote {name} failed the host key check ({said}): connect once with "
                    f"`{self.where}` to check and accept its key, as ssh asks")
        if any(s in low for s in _AUTH):
            return (f"the login node of remote {name} refused the login ({said}): check remote.user and your key "
                    f"(ssh-add, IdentityFile in your ssh config); {try_}")
        if any(s in low for s in _UNREACHABLE):
            return (f"the login node of remote {name} is unreachable ({said}): check remote.host, remote.port and "
                    f"remote.jump; {try_}")
        return f"ssh to the login node of remote {name} failed ({said}): {try_}"

    def command(self, script: str, tty: bool = False) -> list[str]:
        """The argv that runs the shell SCRIPT on the login node (in the remote user's login shell)."""
        return [*self.base(), *(["-t"] if tty else []), self.remote.host, "--", script]

    def run(self, script: str, *, capture: bool = False, stdin: str | None = None,
            tty: bool = False) -> subprocess.CompletedProcess[str]:
        self.open()
        return subprocess.run(self.command(script, tty), input=stdin, text=True, check=False,
                              capture_output=capture,
                              stdin=subprocess.DEVNULL if stdin is None and not tty else None)

    def rsync_shell(self) -> str:
        """rsync's -e: the same ssh, so that the copy rides on the open connection."""
        return shlex.join(self.base())


def _resolved_config(args: list[str]) -> dict[str, str]:
    """`ssh -G`: the settings ssh would use for this host, from the user's config and our options."""
    try:
        out = subprocess.run(["ssh", "-G", *args], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"the system ssh can't run ({err}): install an OpenSSH client") from None
    if out.returncode:
        said = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "no message"
        raise ConfigError(f"ssh rejects the options of this remote ({said}): fix the remote's ssh_config, "
                          "ssh_options or host")
    settings: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key.lower(), value.strip())
    return settings
