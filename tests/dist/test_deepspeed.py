"""DeepSpeed ZeRO 1/2/3 and ZeRO-3 offload on 2 CPU ranks (gloo): they train in every precision this machine
supports, agree with one process in fp32, and stop/resume exactly through the real launcher.

DeepSpeed's import is slow and, on a fresh machine, its CPU ops (shared-memory comm, CPU Adam) are compiled on first
use (about a minute each, then cached in ~/.cache/torch_extensions): the training runs share one spawn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from contract.errors import EXIT_STOPPED
from contract.rundir import ckpt_layout as layout
from tests.conftest import hq, launch, read_metrics
from tests.dist.store import hosted_port
from tests.dist.workers import train_several

pytestmark = pytest.mark.dist

ZERO = ["zero1", "zero2", "zero3", "zero3_offload"]
# The same global batch of 16 sequences everywhere: micro 4 x accumulation 2 x 2 ranks for ZeRO in fp32 (the
# reference of the resume test too), micro 8 x 2 ranks in low precision, micro 16 on one process.
STEPS, STOP = 8, 4
FP32 = ["precision=fp32", f"trainer.max_steps={STEPS}", "trainer.micro_batch_size=4", "trainer.grad_accum_steps=2"]
LOW = ["trainer.max_steps=3", "trainer.micro_batch_size=8"]


# fp16 with DeepSpeed needs GPUs (the launcher refuses it on CPU, see the test below); the gpu tier runs it.
LOW_PRECISIONS = ["bf16"]


def _spawn(out: Path, world: int, runs: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    mp.spawn(train_several, args=(world, hosted_port(world), str(out), runs), nprocs=world)
    return {name: torch.load(out / name / "losses_rank0.pt") for name in runs}


@pytest.fixture(scope="module")
def losses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, float]]:
    """Every ZeRO strategy x precision in one 2-rank spawn (one DeepSpeed import), and the 1-process reference."""
    runs = {f"{s}-fp32": [f"strategy={s}", *FP32] for s in ZERO}
    runs.update({f"{s}-{p}": [f"strategy={s}", f"precision={p}", *LOW] for s in ZERO for p in LOW_PRECISIONS})
    got = _spawn(tmp_path_factory.mktemp("zero"), 2, runs)
    # One process: the plain model, and ZeRO-2 on a world of one (DeepSpeed still needs a process group).
    one = [f"trainer.max_steps={STEPS}", "trainer.micro_batch_size=16"]
    got.update(_spawn(tmp_path_factory.mktemp("one"), 1, {"single": ["strategy=single", *one],
                                                          "zero2-world1": ["strategy=zero2", *one]}))
    return got


@pytest.mark.parametrize("strategy", ZERO)
def test_every_precision_trains(strategy: str, losses: dict[str, dict[int, float]]) -> None:
    for precision in ["fp32", *LOW_PRECISIONS]:
        got = losses[f"{strategy}-{precision}"]
        assert sorted(got) == list(range(1, STEPS + 1 if precision == "fp32" else 4)), precision
        assert all(math.isfinite(v) for v in got.values()), (precision, got)
        assert got[3] < got[1], (precision, got)  # it learns
        # DeepSpeed's bf16 holds the weights in bf16 (fp32 master copy in the optimizer): close, not equal.
        assert got[3] == pytest.approx(losses[f"{strategy}-fp32"][3], rel=2e-2), precision


@pytest.mark.parametrize("strategy", ZERO)
def test_fp32_matches_one_process_on_the_same_global_batch(strategy: str,
                                                           losses: dict[str, dict[int, float]]) -> None:
    got, expected = losses[f"{strategy}-fp32"], losses["single"]
    assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-4), step


def test_one_rank_runs_without_a_launcher_made_process_group(losses: dict[str, dict[int, float]]) -> None:
    assert losses["zero2-world1"] == pytest.approx(losses["single"], rel=1e-4)


def test_fp16_without_gpus_is_refused_before_anything_runs(run_root: Path) -> None:
    out = launch("strategy=zero2", "precision=fp16", "trainer.max_steps=1", "local.nproc=1", "logger.backend=none",
                 f"run.root={hq(run_root)}", "run.name=fp16", CUDA_VISIBLE_DEVICES="")
    assert out.returncode == 2
    assert "precision=fp16 with strategy=zero2 needs GPUs" in out.stderr and "use precision=bf16" in out.stderr
    assert not (run_root / "fp16").exists()


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, list[str]]]:
    """strategy -> (run directory, its command's overrides): the FP32 run stopped after step STOP by a signal and
    resumed by the same command, made once for every test that reads it."""
    made: dict[str, tuple[Path, list[str]]] = {}

    def split(strategy: str) -> tuple[Path, list[str]]:
        if strategy not in made:
            root = tmp_path_factory.mktemp(f"split {strategy}'s")  # shell-hostile, as run_root
            common = [f"strategy={strategy}", *FP32, "trainer.log_every=1", "local.nproc=2", "logger.backend=none",
                      f"run.root={hq(root)}", "run.name=split"]
            stopped = launch(*common, SLURMTRAIN_TEST_SIGNAL=f"{STOP}:1")
            assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
            resumed = launch(*common)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            assert "resumed from" in resumed.stderr and f"step {STOP}," in resumed.stderr
            made[strategy] = (root / "split", common)
        return made[strategy]

    return split


# Resume per partitioning: stage 2 (optimizer and gradients) and stage 3 with offload (parameters too, optimizer
# in host memory); stages 1 and 3 save and load through the same engine calls.
@pytest.mark.parametrize("strategy", ["zero2", "zero3_offload"])
def test_stop_and_resume_equals_the_uninterrupted_run(strategy: str, split_runs: Callable[[str], tuple[Path, list[str]]],
                                                      losses: dict[str, dict[int, float]]) -> None:
    run_dir, _ = split_runs(strategy)
    rows = read_metrics(run_dir)
    got = {r["step"]: r["loss"] for r in rows}
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step logged once
    expected = losses[f"{strategy}-fp32"]  # the same config, uninterrupted (in the spawn above)
    if strategy == "zero3_offload":
        # DeepSpeedCPUAdam keeps beta**t as a running product in C++; a fresh process recomputes it with pow():
        # the bias correction differs in the last bit after a resume.
        assert got == pytest.approx(expected, rel=1e-5)
    else:
        assert got == expected  # bitwise

    trainer = OmegaConf.load(run_dir / "config.yaml").trainer
    assert [c.step for c in layout.list_checkpoints(run_dir)] == [STOP, STEPS]
    for ckpt in layout.list_checkpoints(run_dir):
        assert (ckpt.path / layout.MARKER).is_file()
        assert (ckpt.path / "model_optim").is_dir()  # DeepSpeed's own files, one set per rank
        assert len(list((ckpt.path / "model_optim").glob("*optim_states.pt"))) == 2
        ds = json.loads((ckpt.path / "ds_config.json").read_text())
        assert ds["train_micro_batch_size_per_gpu"] == trainer.micro_batch_size == 4
        assert ds["gradient_accumulation_steps"] == trainer.grad_accum_steps == 2
        assert ds["train_batch_size"] == trainer.global_batch_size == 16
        assert ds["zero_optimization"]["stage"] == (1 if strategy == "zero1" else 2 if strategy == "zero2" else 3)
        assert ("offload_optimizer" in ds["zero_optimization"]) == (strategy == "zero3_offload")
    assert json.loads((run_dir / "ds_config.json").read_text()) == ds  # and in the run directory


def test_deepspeed_checkpoint_refuses_another_world_size(split_runs: Callable[[str], tuple[Path, list[str]]]) -> None:
    """The zero2 run above, written by 2 ranks, asked to go on (the same global batch) on one."""
    run_dir, common = split_runs("zero2")
    before = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*"))
    out = launch(*common, "local.nproc=1", "trainer.grad_accum_steps=4", f"trainer.max_steps={STEPS + 4}")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "written by 2 ranks and DeepSpeed checkpoints resume only on 2 ranks" in out.stderr
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == before
