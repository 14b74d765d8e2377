"""checkpoint.verify_early (issue 48, item 26, the seed's "always test checkpoint loading before a long run"): a
run's first attempt writes a checkpoint after step 1, reads it back into a scratch copy of the state, compares it bit
for bit and deletes it; on by default for SLURM runs, its cost in the plan; a full filesystem or a state that does
not round-trip stops the run at step 1 with one line naming it, and nothing is left behind."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from contract.rundir.env_faults import DISK_FULL_ENV
from launcher.compose import compose_and_plan, compose_config
from tests.conftest import hq, launch
from train.checkpoints.early_check import EarlyCheckFailed, first_difference, verify_round_trip
from train.model.transformer import build_model


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build_model(compose_config(["model=tiny"]).model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = sum(p.float().square().sum() for p in model.parameters())
    loss.backward()
    optimizer.step()  # moments and step counts to save
    return model, optimizer


def test_a_state_that_round_trips_passes_and_leaves_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, optimizer = _trained()
    (tmp_path / "checkpoints").mkdir()
    with caplog.at_level(logging.INFO):
        seconds = verify_round_trip(model, optimizer, tmp_path, is_main=True)
    assert seconds > 0
    assert list((tmp_path / "checkpoints").iterdir()) == []
    assert "read back bit for bit and deleted" in caplog.text


def test_one_flipped_bit_is_named() -> None:
    model, optimizer = _trained()
    live = {"model": {name: p.detach().clone() for name, p in model.named_parameters()}}
    read = {"model": {name: t.clone() for name, t in live["model"].items()}}
    assert first_difference(live, read) is None
    name = next(iter(read["model"]))
    bits = read["model"][name].view(torch.int32)
    bits.view(-1)[0] ^= 1  # the last bit of one value: equal to 1e-7, not bit for bit
    assert first_difference(live, read) == f"model.{name}"


def test_a_full_filesystem_stops_the_check_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = _trained()
    monkeypatch.setenv(DISK_FULL_ENV, "verify_early:1")
    with pytest.raises(EarlyCheckFailed, match=r"checkpoint.verify_early: writing or reading a checkpoint in .* failed "
                                               r"\(OSError: \[Errno 28\] No space left on device"):
        verify_round_trip(model, optimizer, tmp_path, is_main=True)
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.parametrize(("overrides", "on"), [([], False), (["+cluster=local_slurm"], True),
                                                (["+cluster=local_slurm", "checkpoint.verify_early=false"], False),
                                                (["checkpoint.verify_early=true"], True)])
def test_on_by_default_for_slurm_runs_with_its_cost_in_the_plan(overrides: list[str], on: bool) -> None:
    _, plan = compose_and_plan(overrides)
    said = [line for line in plan.summary().splitlines() if "checkpoint check:" in line]
    assert bool(said) == on, plan.summary()
    if on:
        assert "GB per rank written and read once" in said[0]


def test_a_run_whose_check_fails_stops_at_step_1_naming_it(tmp_path: Path) -> None:
    out = launch("checkpoint.verify_early=true", "local.nproc=2", "trainer.max_steps=5", "logger.backend=none",
                 "trainer.progress_bar=false", f"run.root={hq(tmp_path)}", "run.name=r",
                 **{DISK_FULL_ENV: "verify_early:1"})
    assert out.returncode == 2  # one line, never retried: a requeue would meet the same filesystem
    assert "checkpoint.verify_early: writing or reading a checkpoint" in out.stderr, out.stderr[-3000:]
    assert "No space left on device" in out.stderr
    assert not (tmp_path / "r" / "checkpoints" / ".verify_early").exists()
    assert "step 2" not in out.stderr
