"""Mixture of experts and expert parallelism on CPU ranks (gloo): ep=2 trains to ep=1's losses (2 ranks with DDP, bit
for bit), ep=2 and ep=4 within fp32 rounding (4 ranks with FSDP and HSDP) through its periodic checkpoints, a checkpoint resumes on another ep (DDP and FSDP) and another world
size, launcher.evaluate takes an ep=2 run on one process, and the load-balancing loss keeps the expert load even on
skewed data where without it the router collapses; the telemetry is in metrics.jsonl."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.dist.store import hosted_port
from tests.dist.workers import train_several
from tests.forked_cli import run_module

pytestmark = pytest.mark.dist

# 10 steps; the moved run stops at 4 (ep=2) and 7 (ep=1, past the checkpoint of step 5), then ends on 4 ranks.
STEPS, FIRST_STOP, SECOND_STOP = 10, 4, 7
# fp32, 16 sequences of 64 tokens a step; moe_tiny: 4 experts, top 2, dropless, in both layers. A checkpoint every 5
# steps that the runs train on after: under ep=2 the step after a save failed ("mixed torch.Tensor and DTensor").
COMMON = ["model=moe_tiny", "precision=fp32", "trainer.global_batch_size=16", f"trainer.max_steps={STEPS}",
          "trainer.log_every=1", "logger.backend=none", "trainer.ckpt_every=5"]


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """On 2 ranks (DDP): ep=1 and ep=2 uninterrupted, and a run (with activation checkpointing, which recomputes the
    all-to-alls in backward) stopped at step 4 under ep=2, resumed under ep=1 and stopped at 7, then resumed on 4
    ranks under ep=2 (micro batches of 4: the same global batch)."""
    root = tmp_path_factory.mktemp("moe")
    runs = {}
    for ep in (1, 2):
        out = launch(*COMMON, "local.nproc=2", "trainer.micro_batch_size=8", f"parallel.ep={ep}",
                     f"run.root={hq(root)}", f"run.name=ep{ep}")
        assert out.returncode == 0, out.stderr[-3000:]
        runs[f"ep{ep}"] = root / f"ep{ep}"
    moved = [*COMMON, "strategy.activation_checkpointing=true", f"run.root={hq(root)}", "run.name=moved"]
    first = launch(*moved, "local.nproc=2", "trainer.micro_batch_size=8", "parallel.ep=2",
                   SLURMTRAIN_TEST_SIGNAL=f"{FIRST_STOP}:0")
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    second = launch(*moved, "local.nproc=2", "trainer.micro_batch_size=8", "parallel.ep=1",
                    SLURMTRAIN_TEST_SIGNAL=f"{SECOND_STOP}:0")
    assert second.returncode == EXIT_STOPPED, second.stderr[-3000:]
    assert f"step {FIRST_STOP}, {16 * FIRST_STOP} samples consumed" in second.stderr
    third = launch(*moved, "local.nproc=4", "trainer.micro_batch_size=4", "parallel.ep=2")
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"step {SECOND_STOP}, {16 * SECOND_STOP} samples consumed" in third.stderr
    runs["moved"] = root / "moved"
    # Under FSDP, ep=1 to ep=2: ep=2 keeps the experts' whole tensors in optimizer groups of their own, and the load
    # asked the checkpoint for a group it did not have ("Missing key ... param_groups.2").
    sharded = [*COMMON, "strategy=fsdp", "local.nproc=2", "trainer.micro_batch_size=8", f"run.root={hq(root)}",
               "run.name=fsdp_moved"]
    first = launch(*sharded, "parallel.ep=1", SLURMTRAIN_TEST_SIGNAL=f"{FIRST_STOP}:0")
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    second = launch(*sharded, "parallel.ep=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"step {FIRST_STOP}, {16 * FIRST_STOP} samples consumed" in second.stderr
    runs["fsdp_moved"] = root / "fsdp_moved"
    return runs


def test_ep2_trains_to_the_losses_of_ep1(two_ranks: dict[str, Path]) -> None:
    one, two = _losses(two_ranks["ep1"]), _losses(two_ranks["ep2"])
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    assert one[STEPS] < 0.8 * one[1]  # it learns
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


def test_a_checkpoint_resumes_on_another_ep_and_world_size(two_ranks: dict[str, Path]) -> None:
    whole, moved = _losses(two_ranks["ep2"]), _losses(two_ranks["moved"])
    assert sorted(moved) == list(range(1, STEPS + 1))
    # Stopped under ep=2, resumed under ep=1 on the same ranks: bit for bit the uninterrupted run (an expert runs on
    # each rank's tokens apart, so ep changes no arithmetic on 2 ranks).
    for step in range(1, SECOND_STOP + 1):
        assert moved[step] == whole[step], step
    # Resumed on 4 ranks: each rank's micro batch is half as large, the same samples; the same losses to rounding.
    for step in range(SECOND_STOP + 1, STEPS + 1):
        assert moved[step] == pytest.approx(whole[step], rel=1e-5), step
    # FSDP, stopped under ep=1 and resumed under ep=2: the same losses to rounding.
    sharded = _losses(two_ranks["fsdp_moved"])
    assert sorted(sharded) == list(range(1, STEPS + 1))
    for step in sharded:
        assert sharded[step] == pytest.approx(whole[step], rel=1e-5), step


def test_launcher_evaluate_takes_an_ep2_run_on_one_process(two_ranks: dict[str, Path]) -> None:
    """It built the run's expert groups over ranks one process does not have ("Default process group has not been
    initialized"); every expert goes on its one rank, and the loss is ep=1's."""
    said = {}
    for name in ("ep1", "ep2"):
        out = run_module("launcher.evaluate", [str(two_ranks[name])], cwd=ROOT, env=launcher_env())
        assert out.returncode == 0, out.stderr[-3000:]
        found = re.search(rf"evaluate: step {STEPS}: val/val/loss ([0-9.]+)", out.stdout + out.stderr)
        assert found, out.stderr[-3000:]
        said[name] = float(found.group(1))
    assert said["ep2"] == pytest.approx(said["ep1"], rel=1e-4)


def test_moe_telemetry_is_in_metrics_status_and_report(two_ranks: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from launcher import report, status

    row = read_metrics(two_ranks["ep2"])[-1]
    assert set(row["moe_load"]) == {"0", "1"} and all(len(v) == 4 for v in row["moe_load"].values())
    # Every routed token counted once: 16 sequences x 64 tokens x top 2 per layer and step.
    assert all(sum(v) == 16 * 64 * 2 for v in row["moe_load"].values())
    assert row["moe_load_max_mean"] == max(row["moe_load_max_mean_by_layer"].values()) >= 1.0
    assert row["moe_dropped"] == 0.0  # dropless
    assert row["moe_aux_loss"] >= 1.0 - 1e-6 and row["moe_z_loss"] > 0
    capsys.readouterr()
    assert status.main([str(two_ranks["ep2"])]) == 0
    worst = max(row["moe_load_max_mean_by_layer"], key=row["moe_load_max_mean_by_layer"].get)
    assert (f"ep2: experts at step {STEPS}: load max/mean {row['moe_load_max_mean']:.2f} in layer {worst}"
            in capsys.readouterr().out)
    assert report.main([str(two_ranks["ep2"])]) == 0
    assert (two_ranks["ep2"] / "moe_load.png").stat().st_size > 0


# What docs/strategies.md promises of ep on more than 2 ranks: each step's loss within this relative difference of
# ep=1's (fp32 rounding: an expert's gradient is summed over the ranks in another order).
EP_TOLERANCE = 1e-5


def test_ep2_and_ep4_with_fsdp_or_hsdp_on_4_ranks_train_to_ep1s_losses_within_fp32_rounding(tmp_path: Path) -> None:
    """Issue 48, item 1: with 8 experts on 4 ranks, ep=4 against ep=1 differed at step 3 (by rounding), which the docs'
    "ep changes no arithmetic" denied; the docs now say what holds, and this checks it."""
    common = [*COMMON, "model.moe.num_experts=8", "strategy=fsdp", "trainer.micro_batch_size=4"]
    hsdp = [*common[:-2], "strategy=hsdp", "strategy.replicate_degree=2", "trainer.micro_batch_size=4", "parallel.ep=2"]
    runs = {"ep1": common, "ep2": [*common, "parallel.ep=2"], "ep4": [*common, "parallel.ep=4"], "hsdp_ep2": hsdp}
    mp.spawn(train_several, args=(4, hosted_port(4), str(tmp_path), runs), nprocs=4)
    one, *others = (torch.load(tmp_path / name / "losses_rank0.pt") for name in runs)
    assert sorted(one) == list(range(1, STEPS + 1))
    for two in others:
        assert sorted(two) == sorted(one)
        for step in one:
            assert two[step] == pytest.approx(one[step], rel=EP_TOLERANCE), step
    promise = (ROOT / "docs" / "strategies.md").read_text().split("`parallel.ep=N` splits", 1)[1].split("<!--", 1)[0]
    assert "changes no arithmetic" not in promise and f"within a relative {EP_TOLERANCE:.0e}".replace("e-0", "e-") in \
        " ".join(promise.split())


def test_the_load_balancing_loss_keeps_skewed_data_evenly_routed(tmp_path: Path) -> None:
    """A Zipf token stream (a quarter of the tokens one id): without the auxiliary loss the router sends each token to
    the same 2 of the 4 experts (max/mean near 2, the most top 2 of 4 allows); with it the load stays even."""
    tokens = np.minimum(np.random.default_rng(0).zipf(1.3, 100_000) - 1, 255).astype(np.uint16)
    path = tmp_path / "skewed.bin"
    tokens.tofile(path)
    runs = {}
    for name, coef in (("balanced", 0.1), ("unbalanced", 0.0)):
        out = launch("model=moe_tiny", f"model.moe.aux_loss_coef={coef}", "model.moe.z_loss_coef=0", "data=tokens",
                     f"data.path={hq(path)}", "strategy=single", "local.nproc=1", "trainer.micro_batch_size=8",
                     "trainer.max_steps=40", "trainer.log_every=20", "logger.backend=none", f"run.root={hq(tmp_path)}",
                     f"run.name={name}")
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = read_metrics(tmp_path / name)[-1]  # the load over steps 21-40
    assert runs["balanced"]["moe_load_max_mean"] < 1.5, runs["balanced"]
    assert runs["unbalanced"]["moe_load_max_mean"] > 1.9, runs["unbalanced"]
