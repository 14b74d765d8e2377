"""Preemption, checkpoint and exact resume on 2 CPU ranks (gloo, DDP, fp32), through the real launcher."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from contract.errors import EXIT_STOPPED
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from contract.rundir import ckpt_layout as layout

pytestmark = pytest.mark.dist


def _run(run_root: Path, name: str, steps: int, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return launch(f"trainer.max_steps={steps}", "trainer.log_every=1", "local.nproc=2", "logger.backend=none",
                  f"run.root={hq(run_root)}", f"run.name={name}", *extra, **env)


def _losses(run_dir: Path) -> dict[int, float]:
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def test_signal_to_one_rank_stops_both_at_the_same_step(run_root: Path) -> None:
    out = _run(run_root, "sig", 30, SLURMTRAIN_TEST_SIGNAL="7:1")
    assert out.returncode == EXIT_STOPPED, out.stderr[-3000:]
    run_dir = run_root / "sig"
    latest = layout.latest_complete_checkpoint(run_dir)
    assert latest is not None and latest.step == 7
    # Both ranks contributed to the same step's checkpoint, and nobody ran past it.
    assert {p.name for p in latest.path.glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    assert max(_losses(run_dir)) == 7
    assert json.loads((latest.path / layout.MARKER).read_text())["world_size"] == 2


def test_stop_at_17_and_resume_is_bitwise_identical_to_uninterrupted(run_root: Path) -> None:
    whole = _run(run_root, "whole", 40)
    assert whole.returncode == 0, whole.stderr[-3000:]
    first = _run(run_root, "split", 40, SLURMTRAIN_TEST_SIGNAL="17:1")
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    assert max(_losses(run_root / "split")) == 17
    second = _run(run_root, "split", 40)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "step 17" in second.stderr
    expected, got = _losses(run_root / "whole"), _losses(run_root / "split")
    assert sorted(got) == list(range(1, 41))
    assert got == expected  # float equality: bitwise


def test_resume_from_an_async_checkpoint_is_exact(run_root: Path) -> None:
    out = _run(run_root, "async", 20, "trainer.ckpt_every=10")
    assert out.returncode == 0, out.stderr[-3000:]
    expected = _losses(run_root / "async")
    shutil.copytree(run_root / "async", run_root / "again")
    layout.remove(layout.CheckpointDir(20, layout.step_dir(run_root / "again", 20)))
    again = _run(run_root, "again", 20, "trainer.ckpt_every=10")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and "step 10," in again.stderr
    assert _losses(run_root / "again") == expected


def test_sigkill_while_saving_keeps_the_previous_checkpoint(run_root: Path) -> None:
    expected = _run(run_root, "ref", 12, "trainer.ckpt_every=4")
    assert expected.returncode == 0
    killed = _run(run_root, "kill", 12, "trainer.ckpt_every=4", "checkpoint.async_save=false",
                  SLURMTRAIN_TEST_KILL_BEFORE_MARKER="8")
    assert killed.returncode != 0
    assert "SIGKILL" in killed.stderr
    run_dir = run_root / "kill"
    assert [c.step for c in layout.incomplete_checkpoints(run_dir)] == [8]
    assert layout.latest_complete_checkpoint(run_dir).step == 4  # type: ignore[union-attr]
    resumed = _run(run_root, "kill", 12, "trainer.ckpt_every=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ignoring incomplete checkpoint" in resumed.stderr and "step 4," in resumed.stderr
    assert _losses(run_dir) == _losses(run_root / "ref")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_checkpoints_and_the_same_command_resumes(run_root: Path, sig: int) -> None:
    args = ["trainer.max_steps=100000", "trainer.log_every=1", "local.nproc=2", "logger.backend=none",
            f"run.root={hq(run_root)}", "run.name=ctrlc"]
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=ROOT, env=launcher_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until training is under way: the first logged step
        if "step 1/" in line:
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, err[-3000:]
    latest = layout.latest_complete_checkpoint(run_root / "ctrlc")
    assert latest is not None and latest.step == max(_losses(run_root / "ctrlc"))
    out = launch(*[a if not a.startswith("trainer.max_steps") else f"trainer.max_steps={latest.step + 3}"
                   for a in args])
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"step {latest.step}," in out.stderr
    assert max(_losses(run_root / "ctrlc")) == latest.step + 3


def test_signal_during_start_up_is_not_fatal(run_root: Path) -> None:
    # The launcher forwards SIGUSR1 while the workers are still importing torch: they must stop cleanly at the
    # first step boundary, not die of the signal's default action.
    args = ["trainer.max_steps=100000", "local.nproc=2", "logger.backend=none", f"run.root={hq(run_root)}",
            "run.name=early"]
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=ROOT, env=launcher_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # printed as soon as the workers are started, long before they have imported torch
        if line.startswith("launcher: started"):
            break
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_STOPPED, err[-3000:]
    latest = layout.latest_complete_checkpoint(run_root / "early")
    assert latest is not None and latest.step >= 1


def test_resume_false_never_silently_discards_checkpoints(run_root: Path) -> None:
    assert _run(run_root, "keep", 3).returncode == 0
    refused = _run(run_root, "keep", 3, "run.resume=false")
    assert refused.returncode == 2
    assert "run.overwrite=true" in refused.stderr
    assert layout.latest_complete_checkpoint(run_root / "keep") is not None
    fresh = _run(run_root, "keep", 3, "run.resume=false", "run.overwrite=true")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "resumed from" not in fresh.stderr
    assert sorted(_losses(run_root / "keep")) == [1, 2, 3]
    # What a requeue re-reads resumes: resume=false/overwrite=true applied once, at launch.
    saved = OmegaConf.load(run_root / "keep" / "config.yaml").run
    assert saved.resume is True and saved.overwrite is False


def test_rng_state_round_trips() -> None:
    from train.checkpoints.state import rng_state, set_rng_state

    saved = rng_state()
    a = torch.rand(3)
    set_rng_state(saved)
    assert torch.equal(torch.rand(3), a)


def test_checkpoint_settings_do_not_change_the_trajectory(run_root: Path) -> None:
    # Saving (async, sync or not at all) must never touch the training state it saves.
    runs = {"none": ["trainer.ckpt_every=0"], "async": ["trainer.ckpt_every=3"],
            "sync": ["trainer.ckpt_every=3", "checkpoint.async_save=false", "precision=fp16"],
            # fp16's loss scaler may skip the first steps: the optimizer state must not depend on saving either.
            "none16": ["trainer.ckpt_every=0", "precision=fp16"]}
    for name, extra in runs.items():
        out = _run(run_root, name, 8, *extra)
        assert out.returncode == 0, out.stderr[-3000:]
    assert _losses(run_root / "async") == _losses(run_root / "none")
    assert _losses(run_root / "sync") == _losses(run_root / "none16")  # a synchronous save, with fp16's scaler
