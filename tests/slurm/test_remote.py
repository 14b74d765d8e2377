"""`+remote=test` through a real OpenSSH server (make sshd-up) to the local cluster, from a "laptop" directory: the
job runs the snapshot it was submitted with, one login serves the session, status and report bring results here,
a snapshot is copied once, and each failure is one line, exit 2, with nothing submitted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from contract.remote_snapshot import MANIFEST
from tests.conftest import launcher_env
from tests.slurm.helpers import queued_jobs_named, submitted_job_id, wait_terminal
from tests.slurm.remote_helpers import authentications, make_laptop, remote_yaml, require_login_node

pytestmark = pytest.mark.slurm

PROJECT = ["--config-dir", "conf", "model=conv_lm", "data=chars", "+cluster=my_cluster", "cluster.nodes=1",
           "trainer.max_steps=4", "logger.backend=none"]


@pytest.fixture(scope="module")
def laptop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    require_login_node()
    project, workdir = make_laptop(tmp_path_factory.mktemp("laptop"))
    # A private socket directory (short: sockets have a path limit): this module's first command logs in.
    control = tempfile.mkdtemp(prefix="st-ssh-")
    env = {"SLURMTRAIN_SSH_CONTROL_DIR": control, "WANDB_API_KEY": "local-secret"}
    yield project, workdir, env
    subprocess.run(["ssh", "-F", str(remote_yaml(workdir)["ssh_config"]), "-o", f"ControlPath={control}/%C",
                    "-O", "exit", "slurmtrain-sshd"], capture_output=True, check=False)
    shutil.rmtree(control, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)


def run(project: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=project, env=launcher_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def snapshots(workdir: Path) -> list[Path]:
    return sorted(p for p in (workdir / "snapshots").glob("*") if (p / MANIFEST).is_file())


def test_a_session_submits_the_snapshot_once_and_brings_results_here(laptop: tuple[Path, Path, dict]) -> None:
    project, workdir, env = laptop
    logins_before = authentications()
    original = (project / "model.py").read_text()
    # A sweep's dry run (-m goes through) copies the snapshot.
    dry = run(project, env, "-m", "launcher", "-m", *PROJECT, "model.args.dim=32,48", "launcher.dry_run=true",
              "+remote=test")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "dry run: this array would run points 0, 1" in dry.stdout + dry.stderr
    snap_id = re.search(r"snapshot (\w+) \(commit \w+\) copied", dry.stderr).group(1)  # type: ignore[union-attr]
    assert "; secrets withheld: .env" in dry.stderr  # named, not only left out
    # The dry run imported the project's model.py there: its bytecode went into the snapshot, named by its content.
    assert not list((workdir / "snapshots" / snap_id).rglob("__pycache__")), "bytecode written into the snapshot"
    # A commit that changes no shipped file is the same snapshot, on the cluster already: not copied. The run
    # records this launch's commit (it recorded the first launch's, from the snapshot's manifest).
    git = ["git", "-C", str(project), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "no shipped change"], check=True)
    out = run(project, env, "-m", "launcher", *PROJECT, "run.name=laptop_run", "+remote=test")
    assert out.returncode == 0, out.stderr[-3000:]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert f"snapshot {snap_id} (commit {head[:12]}) already on" in out.stderr  # this launch's commit, not the first's
    # Its status line is the laptop's command (NAME:PATH), not the login node's path.
    status_line = next(line.strip() for line in out.stdout.splitlines() if line.strip().startswith("status:"))
    assert status_line.split(None, 1)[1] == "python -m launcher.status --config-dir conf test:outputs/laptop_run"
    # The job runs the snapshot: an edit made here right after submission (one that breaks the model) can't reach it.
    (project / "model.py").write_text("raise SystemExit('the edited model.py ran')\n")
    job_id = submitted_job_id(out.stdout + out.stderr)
    assert [p.name for p in snapshots(workdir)] == [snap_id]
    assert (workdir / "snapshots" / snap_id / "model.py").read_text() == original
    shipped = [f["path"] for f in json.loads((workdir / "snapshots" / snap_id / MANIFEST).read_text())["files"]]
    assert "model.py" in shipped and ".env" not in shipped  # secrets stay here
    assert wait_terminal(job_id) == "COMPLETED"
    # its ranks imported model.py from the snapshot too: their bytecode went to WORKDIR/.pycache (the environment)
    assert not list((workdir / "snapshots" / snap_id).rglob("__pycache__")), "the job wrote bytecode into it"
    environment = json.loads((workdir / "outputs" / "laptop_run" / "environment.json").read_text())
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert environment["snapshot"]["id"] == snap_id
    assert environment["snapshot"]["git_commit"] == commit.stdout.strip()
    assert environment["snapshot"]["git_dirty"] is False
    # The local WANDB_API_KEY (and the .env's) reached neither the remote command's environment nor the run.
    assert "local-secret" not in (workdir / "remote_env.txt").read_text()
    assert "SSH_CONNECTION=" in (workdir / "remote_env.txt").read_text()
    assert "local-secret" not in (workdir / "outputs" / "laptop_run" / "config.yaml").read_text()
    (project / "model.py").write_text(original)

    # An edit is a new snapshot; what it left unchanged is not sent again but hard-linked to the earlier one.
    (project / "data.py").write_text((project / "data.py").read_text() + "\n# edited\n")
    edited = run(project, env, "-m", "launcher", *PROJECT, "launcher.dry_run=true", "+remote=test")
    assert edited.returncode == 0, edited.stderr[-3000:]
    new_id = re.search(r"snapshot (\w+) \(commit \w+, with uncommitted changes\) copied",
                       edited.stderr).group(1)  # type: ignore[union-attr]
    assert sorted(p.name for p in snapshots(workdir)) == sorted([snap_id, new_id])
    old_dir, new_dir = workdir / "snapshots" / snap_id, workdir / "snapshots" / new_id
    assert (new_dir / "corpus.txt").stat().st_ino == (old_dir / "corpus.txt").stat().st_ino
    assert (new_dir / "data.py").stat().st_ino != (old_dir / "data.py").stat().st_ino

    # Results here: the status table on this terminal, the report's PNGs in this directory.
    status = run(project, env, "-m", "launcher.status", "+remote=test", "--config-dir", "conf", "outputs")
    assert status.returncode == 0, status.stderr
    row = next(line.split() for line in status.stdout.splitlines() if line.startswith("laptop_run"))
    assert row[1:4] == [job_id, "COMPLETED", "4/4"]
    as_printed = run(project, env, *status_line.split()[2:])  # the submission's line, typed here as printed
    assert as_printed.returncode == 0 and job_id in as_printed.stdout, as_printed.stderr
    report = run(project, env, "-m", "launcher.report", "--config-dir", "conf", "test:outputs/laptop_run")
    assert report.returncode == 0, report.stderr
    png = project / "outputs" / "laptop_run" / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"here: {png}" in report.stdout

    # An export with --pull, built from the run's own snapshot (its model.py is the project's), lands here too.
    export = run(project, env, "-m", "launcher.export", "--config-dir", "conf", "test:outputs/laptop_run", "--pull")
    assert export.returncode == 0, export.stderr
    pulled = project / "outputs" / "laptop_run" / "export" / "step_4.safetensors"
    assert f"here: {pulled}" in export.stdout and pulled.stat().st_size > 0

    # Extending the run after an edit of the model's code resumed its checkpoint with the new code, the plan silent.
    # An edit that keeps the parameters: the plan names the snapshot that trained the checkpoint and the file.
    (project / "model.py").write_text(original + "\n# a comment\n")
    longer = ["run.name=laptop_run", "trainer.max_steps=8", "+remote=test"]
    commented = run(project, env, "-m", "launcher", *PROJECT, *longer, "launcher.dry_run=true")
    assert commented.returncode == 0, commented.stderr[-3000:]
    assert re.search(rf"code: snapshot \w+ is not snapshot {snap_id}, which trained step_4; changed: data.py, "
                     r"model.py; the checkpoint's \d+ tensors fit", commented.stdout + commented.stderr), \
        commented.stdout + commented.stderr
    # One that adds a parameter: refused before anything is submitted, naming it and the file.
    (project / "model.py").write_text(original.replace("        self.norm = nn.LayerNorm(dim)\n",
                                                       "        self.norm = nn.LayerNorm(dim)\n"
                                                       "        self.extra = nn.Linear(dim, dim)\n", 1))
    grown = run(project, env, "-m", "launcher", *PROJECT, *longer)
    last = grown.stderr.strip().splitlines()[-1]
    assert grown.returncode == 2 and last.startswith("error: the checkpoint this run resumes, "), grown.stderr[-3000:]
    assert "extra.weight" in last and last.endswith("which trained step_4; changed: data.py, model.py)"), last
    assert queued_jobs_named("laptop_run") == []
    (project / "model.py").write_text(original)

    # One login for the whole session: the submissions, the copies, status, report and export.
    assert authentications() - logins_before == 1


def _refused(project: Path, env: dict[str, str], run_name: str, *args: str) -> str:
    out = run(project, env, "-m", "launcher", *PROJECT, f"run.name={run_name}", *args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert queued_jobs_named(run_name) == []
    return lines[0]


def test_each_failure_is_one_line_exit_2_and_nothing_submitted(laptop: tuple[Path, Path, dict],
                                                               tmp_path: Path) -> None:
    project, workdir, env = laptop
    fresh = {**env, "SLURMTRAIN_SSH_CONTROL_DIR": tempfile.mkdtemp(prefix="st-ssh-")}  # no open connection
    remotes = project / "conf" / "remote"
    ssh_config = Path(remote_yaml(workdir)["ssh_config"])
    # A key the login node does not know, in an ssh config of its own.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong_key")], check=True)
    wrong_config = tmp_path / "ssh_config"
    wrong_config.write_text(re.sub(r"IdentityFile .*", f"IdentityFile {tmp_path / 'wrong_key'}",
                                   ssh_config.read_text()))
    # A slurmtrain of another version: a dist-info ahead of the real one on the remote's PYTHONPATH.
    fake = tmp_path / "other_version"
    (fake / "slurmtrain-0.0.1.dist-info").mkdir(parents=True)
    (fake / "slurmtrain-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: slurmtrain\n"
                                                                  "Version: 0.0.1\n")
    base = remote_yaml(workdir)
    cases = {
        "wrongkey": ({"ssh_config": str(wrong_config)}, "refused the login (root@127.0.0.1: Permission denied"),
        "nopython": ({"python": "/usr/bin/python3", "setup": []}, "slurmtrain is missing on the login node"),
        "oldversion": ({"setup": [f"export PYTHONPATH={fake}:{base['setup'][0].split('=', 1)[1]}",
                                  base["setup"][1]]}, "is version 0.0.1, here it is"),
    }
    for name, (changes, _) in cases.items():
        (remotes / f"{name}.yaml").write_text(yaml.safe_dump(remote_yaml(workdir, **changes)))
    before = snapshots(workdir), sorted((workdir / "outputs").glob("*")) if (workdir / "outputs").exists() else []
    line = _refused(project, fresh, "unreachable", "+remote=test", "remote.port=1")
    assert "is unreachable (ssh: connect to host 127.0.0.1 port 1: Connection refused)" in line
    for name, (_, expected) in cases.items():
        assert expected in _refused(project, fresh, name, f"+remote={name}")
    # a workdir that can't be made was reported as 'slurmtrain is missing on the login node (cd: ...)'
    nowhere = _refused(project, fresh, "nowhere", "+remote=test", "remote.workdir=/proc/slurmtrain-nowhere")
    assert "remote.workdir=/proc/slurmtrain-nowhere can't be created on the login node" in nowhere
    big = _refused(project, fresh, "big", "+remote=test", "remote.max_snapshot_mb=0.01")
    assert "over remote.max_snapshot_mb=0.01: most of it is corpus.txt" in big
    after = snapshots(workdir), sorted((workdir / "outputs").glob("*")) if (workdir / "outputs").exists() else []
    assert after == before  # no snapshot copied, no run directory made
    subprocess.run(["ssh", "-F", str(ssh_config), "-o", f"ControlPath={fresh['SLURMTRAIN_SSH_CONTROL_DIR']}/%C",
                    "-O", "exit", "slurmtrain-sshd"], capture_output=True, check=False)  # the login of nopython's
    shutil.rmtree(fresh["SLURMTRAIN_SSH_CONTROL_DIR"])


def test_through_a_jump_host_a_session_is_still_one_login(laptop: tuple[Path, Path, dict]) -> None:
    project, workdir, env = laptop
    fresh = {**env, "SLURMTRAIN_SSH_CONTROL_DIR": tempfile.mkdtemp(prefix="st-ssh-")}
    (project / "conf" / "remote" / "viajump.yaml").write_text(yaml.safe_dump(remote_yaml(
        workdir, jump="slurmtrain-sshd")))  # the login node is its own jump host: ssh -J
    logins_before = authentications()
    for _ in range(2):  # two commands that run there
        usage = run(project, fresh, "-m", "launcher.status", "--config-dir", "conf", "+remote=viajump", "--help")
        assert usage.returncode == 0, usage.stderr
        assert usage.stdout.startswith("usage: python -m launcher.status")
    # One login at the jump host and one at the login node behind it, for both commands.
    assert authentications() - logins_before == 2
    closed = subprocess.run(["ssh", "-F", str(remote_yaml(workdir)["ssh_config"]), "-J", "slurmtrain-sshd", "-o",
                             f"ControlPath={fresh['SLURMTRAIN_SSH_CONTROL_DIR']}/%C", "-O", "exit", "slurmtrain-sshd"],
                            capture_output=True, check=False)
    assert closed.returncode == 0, closed.stderr  # the master was there (ssh's %C includes the jump host)
    shutil.rmtree(fresh["SLURMTRAIN_SSH_CONTROL_DIR"])


def test_ctrl_c_during_the_copy_is_one_line_and_leaves_nothing_there(laptop: tuple[Path, Path, dict],
                                                                       tmp_path: Path) -> None:
    """It blamed rsync ("check that rsync is installed there") and left .incoming-* on the login node."""
    project, workdir, env = laptop
    real = shutil.which("rsync")
    assert real is not None
    slow = tmp_path / "rsync"  # this side's rsync, slowed down: the copy is under way when Ctrl-C comes
    slow.write_text(f'#!/bin/sh\nexec {real} --bwlimit=50 "$@"\n')
    slow.chmod(0o755)
    big = project / "interrupted.bin"
    big.write_bytes(os.urandom(1_000_000))
    snaps = workdir / "snapshots"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *PROJECT, "launcher.dry_run=true", "+remote=test"],
                            cwd=project, env=launcher_env(**env, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as a terminal starts it: a shell's background job (make test &) inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while not any(any(p.rglob("*interrupted.bin*")) for p in snaps.glob(".incoming-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        _, err = proc.communicate(timeout=120)
    finally:
        big.unlink()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "launcher: interrupted (Ctrl-C) while copying the project to slurmtrain-sshd (the part copied there is "
        "removed): nothing was submitted; run the same command again"), err
    assert "rsync" not in err
    assert list(snaps.glob(".incoming-*")) == []

