"""A user's model with 0-dim parameters (tests/fixtures/user_models.ScaledLM: a temperature and a gain per block)
on 2 ranks. DDP takes them as they are; FSDP2 can't shard them, so fsdp and hsdp train them whole on every rank and
average their gradients: the same training run as DDP's, with the parameters under their own names and shapes in
the checkpoint and the export, and a resume that continues."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import hq, launch, launcher_env, read_metrics
from tests.forked_cli import EXPORT_PRELOAD, run_module

pytestmark = pytest.mark.dist

SCALARS = ("temperature", "layers.0.gain", "layers.1.gain")
MODEL = ("model._target_=tests.fixtures.user_models.ScaledLM", "+model.args.vocab_size=256", "local.nproc=2",
         # Gradients accumulate over 2 micro steps before they are averaged; hsdp: 2 replicas of 1 shard.
         "trainer.grad_accum_steps=2", "trainer.log_every=1", "logger.backend=none")


def _export(run_dir: Path) -> dict[str, torch.Tensor]:
    # `python -m launcher.export`, forked from a process that imported torch already (tests/forked_cli.py).
    out = run_module("launcher.export", [str(run_dir), "--format", "safetensors"], cwd=os.getcwd(),
                     env=launcher_env(), timeout=300, preload=EXPORT_PRELOAD)
    assert out.returncode == 0, out.stderr[-2000:]
    return load_file(out.stdout.strip().splitlines()[-1])


def test_scalar_parameters_train_under_fsdp_as_under_ddp(run_root: Path) -> None:
    out = launch("-m", *MODEL, "strategy=ddp,fsdp", "trainer.max_steps=6", f"run.root={hq(run_root)}",
                 "launcher.sweep_name=scalars", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    # hsdp with 2 replicas of 1 shard: strategy.replicate_degree is hsdp's alone (ddp and fsdp refuse it, unread).
    hsdp = launch(*MODEL, "strategy=hsdp", "strategy.replicate_degree=2", "trainer.max_steps=6",
                  f"run.root={hq(run_root)}", "run.name=hsdp", timeout=600)
    assert hsdp.returncode == 0, hsdp.stderr[-3000:]
    points = [Path(p.run_dir) for p in load_sweep(run_root / "sweeps" / "scalars").points] + [run_root / "hsdp"]
    runs = {OmegaConf.load(run_dir / "config.yaml").strategy.name: run_dir for run_dir in points}
    assert sorted(runs) == ["ddp", "fsdp", "hsdp"]
    losses = {name: [r["loss"] for r in read_metrics(run_dir)] for name, run_dir in runs.items()}
    exports = {name: _export(run_dir) for name, run_dir in runs.items()}
    for name in ("fsdp", "hsdp"):
        # Every step, and the scalars themselves: their gradients were averaged over the ranks as DDP's are.
        assert losses[name] == pytest.approx(losses["ddp"], rel=1e-4), (name, losses)
        for key in SCALARS:
            assert exports[name][key].shape == torch.Size([]), (name, key)
            assert exports[name][key].item() == pytest.approx(exports["ddp"][key].item(), rel=1e-4), (name, key)
    assert exports["ddp"]["temperature"].item() != 1.0  # trained, not left at its initial value
    assert len(losses["ddp"]) == 6 and losses["ddp"][-1] < losses["ddp"][0]

    # The same command with more steps resumes the fsdp run from its sharded checkpoint.
    again = launch(*MODEL, "strategy=fsdp", "trainer.max_steps=8", f"run.root={hq(run_root)}", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout + again.stderr
    rows = read_metrics(runs["fsdp"])
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert _export(runs["fsdp"])["temperature"].shape == torch.Size([])
