"""Tensor and pipeline parallelism on CPU ranks with gloo: every layout reaches single-process training's loss on
the same global batch, and a checkpoint saved on one layout resumes on another without a repeated or skipped
sample, matching an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from tests.conftest import hq, launch, read_metrics, traced_samples
from tests.dist.store import hosted_port
from tests.dist.workers import train_several

pytestmark = pytest.mark.dist

# fp32, fixed seed; untied embeddings (tensor and pipeline parallelism split the embedding from the output
# layer); 16 sequences per step as 16 micro batches of 1 over the data-parallel ranks (a pipeline needs 4 x pp).
COMMON = ["model.tie_embeddings=false", "trainer.global_batch_size=16", "trainer.micro_batch_size=1",
          "trainer.max_steps=5", "trainer.ckpt_every=0", "precision=fp32"]


def _spawn(tmp_path: Path, world: int, runs: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    mp.spawn(train_several, args=(world, hosted_port(world), str(tmp_path), runs), nprocs=world)
    return {name: torch.load(tmp_path / name / "losses_rank0.pt") for name in runs}


def test_every_layout_reaches_the_single_process_loss(tmp_path: Path) -> None:
    one = _spawn(tmp_path / "one", 1, {"single": [*COMMON, "strategy=single"],
                                       "single4": [*COMMON, "strategy=single", "model.n_layers=4"]})
    reference = one["single"]
    # Tensor parallelism needs no accumulation: micro batches of 8 (2 ranks) and 4 (4 ranks) are faster.
    two = _spawn(tmp_path / "two", 2, {"tp2": [*COMMON, "strategy=fsdp", "parallel.tp=2", "trainer.micro_batch_size=8"],
                                       "pp2": [*COMMON, "strategy=fsdp", "parallel.pp=2"],
                                       # 2 stages per rank: 4 layers over 4 stages.
                                       "pp2_interleaved": [*COMMON, "strategy=fsdp", "parallel.pp=2",
                                                           "parallel.pp_schedule=interleaved_1f1b",
                                                           "model.n_layers=4"]})
    four = _spawn(tmp_path / "four", 4, {"tp2_fsdp2": [*COMMON, "strategy=fsdp", "parallel.tp=2",
                                                       "trainer.micro_batch_size=4"],
                                         "pp2_fsdp2": [*COMMON, "strategy=fsdp", "parallel.pp=2"],
                                         "tp2_fsdp2_ac_bf16": [*COMMON, "strategy=fsdp", "parallel.tp=2",
                                                               "trainer.micro_batch_size=4", "precision=bf16",
                                                               "strategy.activation_checkpointing=true"]})
    low = four.pop("tp2_fsdp2_ac_bf16")  # bf16 stays close to fp32 over these steps, and learns
    assert low[5] == pytest.approx(reference[5], rel=2e-2) and low[5] < 0.95 * low[1], (low, reference)
    assert sorted(reference) == [1, 2, 3, 4, 5] and reference[5] < 0.95 * reference[1]  # it learns
    for name, losses in {**two, **four}.items():
        expected = one["single4"] if "interleaved" in name else reference
        assert sorted(losses) == [1, 2, 3, 4, 5], name
        for step in (1, 5):
            assert losses[step] == pytest.approx(expected[step], rel=1e-4), (name, step, losses, expected)


def test_a_checkpoint_resumes_on_another_layout_and_back(run_root: Path, tmp_path: Path,
                                                         uninterrupted: dict[int, float]) -> None:
    """tp=2 x fsdp=2 stopped at step 10, resumed with fsdp=4 and stopped at 15, resumed with tp=2 x fsdp=2 to 20."""
    trace = tmp_path / "trace"
    trace.mkdir()
    common = [*COMMON[:2], "trainer.micro_batch_size=4", "trainer.max_steps=20", "trainer.log_every=1",
              "strategy=fsdp", "local.nproc=4", "logger.backend=none", f"run.root={hq(run_root)}", "run.name=moved"]
    first = launch(*common, "parallel.tp=2", SLURMTRAIN_TEST_SIGNAL="10:0", SLURMTRAIN_TRACE_SAMPLES=str(trace))
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    second = launch(*common, SLURMTRAIN_TEST_SIGNAL="15:0", SLURMTRAIN_TRACE_SAMPLES=str(trace))
    assert second.returncode == EXIT_STOPPED, second.stderr[-3000:]
    assert "step 10, 160 samples consumed" in second.stderr
    third = launch(*common, "parallel.tp=2", SLURMTRAIN_TRACE_SAMPLES=str(trace))
    assert third.returncode == 0, third.stderr[-3000:]
    assert "step 15, 240 samples consumed" in third.stderr
    got = {r["step"]: r["loss"] for r in read_metrics(run_root / "moved")}
    assert sorted(got) == list(range(1, 21))
    for step in range(1, 21):
        assert got[step] == pytest.approx(uninterrupted[step], rel=1e-5), step
    steps = traced_samples(trace)
    assert sorted(steps) == list(range(1, 21))
    for step, indices in steps.items():  # each sample once: 16 per step, in global order
        assert sorted(indices) == list(range(16 * (step - 1), 16 * step)), step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    root = tmp_path_factory.mktemp("whole")
    out = launch(*COMMON[:2], "trainer.micro_batch_size=4", "trainer.max_steps=20", "trainer.log_every=1", "strategy=fsdp", "local.nproc=4",
                 "logger.backend=none", f"run.root={hq(root)}", "run.name=whole")
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["step"]: r["loss"] for r in read_metrics(root / "whole")}
