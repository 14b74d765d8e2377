"""The torch strategies x precisions on 2 CPU ranks: they train, agree with one process, checkpoint and resume
(also on another world size). DeepSpeed's ZeRO strategies have their own file (test_deepspeed.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from tests.conftest import hq, launch, read_metrics, traced_samples
from tests.dist.store import hosted_port
from tests.dist.workers import train_several

pytestmark = pytest.mark.dist

TORCH_STRATEGIES = ["ddp", "fsdp", "fsdp_grad_op", "hsdp"]
PRECISIONS = ["fp32", "bf16", "fp16"]


def _spawn(tmp_path: Path, world: int, runs: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    mp.spawn(train_several, args=(world, hosted_port(world), str(tmp_path), runs), nprocs=world)
    return {name: torch.load(tmp_path / name / "losses_rank0.pt") for name in runs}


@pytest.fixture(scope="module")
def single_process_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    # The same global batch (16 sequences) on one process: micro 8 x accumulation 2.
    out = tmp_path_factory.mktemp("single")
    return _spawn(out, 1, {"ref": ["strategy=single", "trainer.max_steps=5", "trainer.grad_accum_steps=2"]})["ref"]


@pytest.mark.parametrize("strategy", TORCH_STRATEGIES)
def test_every_precision_trains_and_fp32_matches_one_process(
    strategy: str, tmp_path: Path, single_process_reference: dict[int, float]
) -> None:
    runs = {p: [f"strategy={strategy}", f"precision={p}", "trainer.max_steps=5" if p == "fp32" else
                "trainer.max_steps=3"] for p in PRECISIONS}
    losses = _spawn(tmp_path, 2, runs)
    for precision in PRECISIONS:
        got = losses[precision]
        assert sorted(got) == list(range(1, 6 if precision == "fp32" else 4)), precision
        assert all(math.isfinite(v) for v in got.values()), (precision, got)
        assert got[3] < got[1], (precision, got)  # it learns
        # Low precision stays close to fp32 on these first steps.
        assert got[3] == pytest.approx(losses["fp32"][3], rel=2e-2), precision
    assert losses["fp32"][5] == pytest.approx(single_process_reference[5], rel=1e-4)


# Resume of a sharded layout: fsdp (ZeRO-3 layout). ddp's resume is tested bitwise in test_preemption.py; hsdp and
# fsdp_grad_op save through the same FSDP2 state dict, and test_parallel.py resumes across other meshes.
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_stop_at_7_resume_reaches_the_same_loss_at_12(strategy: str, run_root: Path) -> None:
    common = [f"strategy={strategy}", "trainer.max_steps=12", "trainer.log_every=1", "local.nproc=2",
              "logger.backend=none", f"run.root={hq(run_root)}"]
    whole = launch(*common, "run.name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = launch(*common, "run.name=split", SLURMTRAIN_TEST_SIGNAL="7:0")
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    resumed = launch(*common, "run.name=split")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    expected = {r["step"]: r["loss"] for r in read_metrics(run_root / "whole")}
    got = {r["step"]: r["loss"] for r in read_metrics(run_root / "split")}
    assert sorted(got) == list(range(1, 13))
    assert got == expected  # these strategies are deterministic on CPU: bitwise


def test_fsdp_resumes_on_a_different_world_size_without_repeating_or_skipping(run_root: Path,
                                                                               tmp_path: Path) -> None:
    tmp_path = tmp_path / "trace"
    tmp_path.mkdir()
    common = ["strategy=fsdp", "trainer.global_batch_size=16", "trainer.micro_batch_size=8", "trainer.log_every=1",
              "logger.backend=none", f"run.root={hq(run_root)}", "run.name=resize"]
    first = launch(*common, "local.nproc=2", "trainer.max_steps=10", SLURMTRAIN_TRACE_SAMPLES=str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    second = launch(*common, "local.nproc=1", "trainer.max_steps=20", SLURMTRAIN_TRACE_SAMPLES=str(tmp_path))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "step 10," in second.stderr
    assert "world size changed (2 -> 1)" in second.stderr
    traced = traced_samples(tmp_path)
    assert sorted(traced) == list(range(1, 21))
    for step, indices in traced.items():
        assert sorted(indices) == list(range((step - 1) * 16, step * 16)), step
    assert {p.name for p in tmp_path.iterdir()} == {"rank0_world2.txt", "rank1_world2.txt", "rank0_world1.txt"}
    rows = read_metrics(run_root / "resize")
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert rows[-1]["loss"] < rows[9]["loss"]  # training went on from the restored state


def test_one_rank_checkpoint_resumes_on_two(run_root: Path) -> None:
    common = ["strategy=fsdp", "trainer.global_batch_size=16", "trainer.micro_batch_size=8", "trainer.log_every=1",
              "logger.backend=none", f"run.root={hq(run_root)}", "run.name=grow"]
    assert launch(*common, "local.nproc=1", "trainer.max_steps=4").returncode == 0
    out = launch(*common, "local.nproc=2", "trainer.max_steps=8")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "world size changed (1 -> 2)" in out.stderr
    assert [r["step"] for r in read_metrics(run_root / "grow")] == list(range(1, 9))


def test_activation_checkpointing_and_compile_keep_the_losses(tmp_path: Path) -> None:
    # Recomputing activations in backward is exact; a compiled block may fuse differently (tolerance).
    runs = {
        "plain": ["strategy=fsdp", "trainer.max_steps=3"],
        "ac": ["strategy=fsdp", "trainer.max_steps=3", "strategy.activation_checkpointing=true"],
        "compiled": ["strategy=ddp", "trainer.max_steps=3", "strategy.compile=true",
                     "strategy.activation_checkpointing=true"],
    }
    losses = _spawn(tmp_path, 2, runs)
    assert losses["ac"] == losses["plain"]
    assert losses["compiled"][3] == pytest.approx(losses["plain"][3], rel=1e-4)


def test_the_whole_model_compiled_keeps_the_losses(tmp_path: Path) -> None:
    """strategy.compile_unit=model: one graph across the blocks and the head (under DDP, split at its buckets) trains
    to the eager losses. One process: inductor on CPU costs about 30 s of CPU for this model."""
    runs = {"eager": ["strategy=ddp", "trainer.max_steps=3"],
            "whole": ["strategy=ddp", "trainer.max_steps=3", "strategy.compile=true", "strategy.compile_unit=model"]}
    losses = _spawn(tmp_path, 1, runs)
    assert sorted(losses["whole"]) == [1, 2, 3]
    for step, loss in losses["eager"].items():
        assert losses["whole"][step] == pytest.approx(loss, rel=1e-4), step
