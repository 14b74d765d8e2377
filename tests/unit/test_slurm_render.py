"""Dry runs render the exact sbatch script without a cluster and without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import hq, launch


def test_a100x16_dry_run_script(run_root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "launcher", "+cluster=a100x16", "strategy=ddp",
         "launcher.dry_run=true", f"run.root={hq(run_root)}", "run.name=dry"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    script = out.stdout
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --requeue", "#SBATCH --signal=USR1@90", "export NCCL_IB_DISABLE=0"]:
        assert line in script.splitlines(), line
    assert "torchrun" not in script and "srun" in script
    assert (run_root / "dry" / "sbatch.dry_run.sh").read_text().strip() == script.strip()
    assert not (run_root / "dry" / "config.yaml").exists()  # a dry run leaves the run contract alone
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "submitit" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_secrets_in_cluster_env_are_refused(run_root: Path) -> None:
    out = launch("+cluster=a100x16", "launcher.dry_run=true", "+cluster.env.WANDB_API_KEY=abc123",
                 f"run.root={hq(run_root)}", "run.name=sec")
    assert out.returncode == 2
    assert "WANDB_API_KEY" in out.stderr and "export them in your shell" in out.stderr
    assert not (run_root / "sec").exists()


@pytest.mark.parametrize("override", ['cluster.setup=["export WANDB_API_KEY=abc123"]',
                                      '+cluster.extra_sbatch.comment="HF_TOKEN=abc123"'])
def test_secrets_in_setup_lines_or_extra_sbatch_are_refused(run_root: Path, override: str) -> None:
    out = launch("+cluster=a100x16", "launcher.dry_run=true", override, f"run.root={hq(run_root)}", "run.name=sec")
    assert out.returncode == 2, out.stderr
    assert "secrets are never written" in out.stderr
    assert not (run_root / "sec").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("cluster.signal=KILL", "not a signal the ranks can catch"),
    ("cluster.signal=FOO", "not a signal the ranks can catch"),
    ("cluster.signal_lead_s=70000", "a value in [1, 65535]"),
])
def test_bad_signal_settings_are_refused_before_anything_is_written(run_root: Path, override: str,
                                                                   message: str) -> None:
    out = launch("+cluster=a100x16", "launcher.dry_run=true", override, f"run.root={hq(run_root)}", "run.name=sig")
    assert out.returncode == 2
    assert message in out.stderr
    assert not (run_root / "sig").exists()


def test_dry_run_config_and_script_hold_no_secret_from_the_environment(run_root: Path) -> None:
    out = launch("+cluster=h100x64", "launcher.dry_run=true", f"run.root={hq(run_root)}", "run.name=env",
                 WANDB_API_KEY="supersecret-token-123")
    assert out.returncode == 0, out.stderr
    for f in (run_root / "env").rglob("*"):
        if f.is_file():
            assert "supersecret" not in f.read_text()


def test_follow_gives_up_when_the_job_vanishes_without_accounting(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from launcher.run import slurm

    polls = []
    monkeypatch.setattr(slurm, "job_state", lambda job_id: polls.append(job_id) or ("", ""))
    monkeypatch.setattr(slurm, "in_queue", lambda job_id: len(polls) < 3)  # queued for 2 polls, then gone
    monkeypatch.setattr(slurm, "POLL_S", 0.0)
    assert slurm.follow("77", tmp_path / "missing.log") == 1
    assert len(polls) == 2 + slurm.UNKNOWN_POLLS


def test_follow_returns_the_jobs_result(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from launcher.run import slurm

    states = iter([("PENDING", ""), ("RUNNING", ""), ("FAILED", "1:0")])
    monkeypatch.setattr(slurm, "job_state", lambda job_id: next(states))
    monkeypatch.setattr(slurm, "in_queue", lambda job_id: True)
    monkeypatch.setattr(slurm, "POLL_S", 0.0)
    log = tmp_path / "r0.err"
    log.write_text("step 1 loss 5.0\n")
    assert slurm.follow("78", log) == 1
