"""The local login node of the remote tests (make sshd-up): its files, a gate that fails in CI when it is down, and
a "laptop" project whose conf/remote/ names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, copy_example

SSHD_DIR = Path(os.environ.get("SLURMTRAIN_SSHD_DIR", "/var/tmp/slurmtrain-sshd"))
SSH_CONFIG = SSHD_DIR / "client" / "ssh_config"
SSHD_LOG = SSHD_DIR / "log" / "sshd.log"
HOST = "slurmtrain-sshd"
SLURM_CONF = "/var/tmp/slurmtrain-slurm/etc/slurm.conf"


def login_node_up() -> bool:
    if not SSH_CONFIG.is_file() or shutil.which("rsync") is None:
        return False
    try:
        return subprocess.run(["ssh", "-F", str(SSH_CONFIG), "-o", "ControlPath=none", HOST, "true"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_login_node() -> None:
    """As the slurm tier does for its cluster: a failure in CI, a skip elsewhere."""
    if login_node_up():
        return
    message = f"no local login node answers `ssh -F {SSH_CONFIG} {HOST}`: run `make sshd-up`"
    if os.environ.get("CI"):
        pytest.fail("CI must run the remote tests but " + message)
    pytest.skip(message)


def authentications() -> int:
    """sshd's count of logins so far (LogLevel VERBOSE: one "Accepted publickey" line each)."""
    return SSHD_LOG.read_text(errors="replace").count("Accepted publickey")


def remote_yaml(workdir: Path, **changes: object) -> dict:
    remote = {"host": HOST, "ssh_config": str(SSH_CONFIG), "workdir": str(workdir), "python": sys.executable,
              "setup": [f"export PYTHONPATH={ROOT}", f"export SLURM_CONF={SLURM_CONF}"]}
    remote.update(changes)
    return remote


def make_laptop(tmp: Path) -> tuple[Path, Path]:
    """examples/byo_project as a git tree (shell-hostile path) with conf/remote/test.yaml for the local login node,
    and its own cluster-side work directory; a .env with a secret that must stay here."""
    project = copy_example(tmp)
    workdir = SSHD_DIR / "work" / f"test-{uuid.uuid4().hex[:8]}"
    (project / "conf" / "remote").mkdir()
    # Its last setup command keeps the environment a remote command gets (to show what was sent).
    setup = [*remote_yaml(workdir)["setup"], f"env > {workdir}/remote_env.txt"]
    (project / "conf" / "remote" / "test.yaml").write_text(yaml.safe_dump(remote_yaml(workdir, setup=setup)))
    (project / ".env").write_text("WANDB_API_KEY=local-secret\n")
    git = ["git", "-C", str(project), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "laptop"], check=True)
    return project, workdir
