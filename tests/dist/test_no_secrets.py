"""Tokens in the environment never reach a file a run writes (config dumps, commands, logs, metrics, wandb's
offline run, checkpoints), locally and in the SLURM submission's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hq, launch

pytestmark = pytest.mark.dist

SECRETS = {"WANDB_API_KEY": "wandb-secret-4f1c9e", "HF_TOKEN": "hf_secret_77ab21", "GITHUB_TOKEN": "ghp_secret_0c3d",
           "AWS_SECRET_ACCESS_KEY": "aws-secret-9e8d", "OPENAI_API_KEY": "sk-secret-51aa"}


def _leaks(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(root)}: {name}" for name, value in SECRETS.items() if value.encode() in data]
    return found


def test_no_file_a_run_writes_holds_a_token_from_the_environment(run_root: Path) -> None:
    # wandb offline (its run files included), a checkpoint, telemetry, a plan, and a dry-run sbatch script.
    out = launch("trainer.max_steps=3", "trainer.ckpt_every=2", "local.nproc=2", f"run.root={hq(run_root)}",
                 "run.name=secrets", **SECRETS)
    assert out.returncode == 0, out.stderr[-3000:]
    dry = launch("+cluster=local_slurm", "launcher.dry_run=true", f"run.root={hq(run_root)}", "run.name=dry",
                 **SECRETS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert (run_root / "secrets" / "wandb").is_dir() and (run_root / "secrets" / "checkpoints").is_dir()
    assert not _leaks(run_root)
    assert not any(value in out.stdout + out.stderr + dry.stdout + dry.stderr for value in SECRETS.values())
