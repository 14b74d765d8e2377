"""Stop and resume on 4 CPU ranks is bitwise the uninterrupted run, for ddp, fsdp, hsdp, zero2 and with gradient
compression (bf16, PowerSGD). With 2 ranks a + b == b + a hides any change in how a sum is laid out; with 4 the
ring all-reduce adds each segment in another rank order, so DDP's bucket layout (rebuilt after an attempt's first
step before train/strategies/ddp.py fixed it at construction) and PowerSGD's error feedback (carried through the
checkpoint) both show in the last bits. One spawn trains every run (5 minutes on 2 busy cores)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import read_metrics
from tests.dist.resume_workers import stop_and_resume
from tests.dist.store import hosted_port
from train.weights.export import load_model_state

pytestmark = pytest.mark.dist

# 3 steps resumed: DDP's buckets were rebuilt after an attempt's first step (steps 5 and 6 would show it), and
# PowerSGD's error feedback from before the stop weighs on every step after it.
WORLD, STEPS, STOP = 4, 6, 3
# optim.warmup_steps=2: PowerSGD compresses from step 3 (after the warmup), so its state is live at the stop.
RUNS = {
    "ddp": ["strategy=ddp"],
    "fsdp": ["strategy=fsdp"],
    "hsdp": ["strategy=hsdp", "strategy.replicate_degree=2"],  # 2 replicas x 2 shards: reduce-scatter + all-reduce
    "ddp_bf16": ["strategy=ddp", "strategy.grad_compression=bf16"],
    "hsdp_bf16": ["strategy=hsdp", "strategy.replicate_degree=2", "strategy.grad_compression=bf16"],
    "ddp_powersgd": ["strategy=ddp", "strategy.grad_compression=powersgd", "strategy.powersgd_rank=2",
                     "optim.warmup_steps=2"],
    "zero2": ["strategy=zero2"],
}


def _losses(run_dir: Path) -> dict[int, float]:
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def _differing(a: Path, b: Path) -> list[str]:
    x, y = (load_model_state(d / "checkpoints" / f"step_{STEPS}") for d in (a, b))
    assert sorted(x) == sorted(y)
    return [k for k in x if not torch.equal(x[k], y[k])]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume4")
    runs = {name: [f"trainer.max_steps={STEPS}", *overrides] for name, overrides in RUNS.items()}
    if importlib.util.find_spec("deepspeed") is None:
        runs.pop("zero2")
    mp.spawn(stop_and_resume, args=(WORLD, hosted_port(WORLD), str(out), runs, STOP, ["ddp_powersgd"]),
             nprocs=WORLD)
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_four_rank_stop_and_resume_is_bitwise_the_uninterrupted_run(trained: Path, name: str) -> None:
    if name == "zero2" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    whole, split = trained / name / "whole", trained / name / "split"
    got, expected = _losses(split), _losses(whole)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert max(_losses(whole)) == STEPS
    assert got == expected  # float equality: bitwise
    assert _differing(whole, split) == []


def test_powersgd_state_is_what_keeps_its_resume_exact(trained: Path) -> None:
    """The same resume without the PowerSGD state files (error feedback, P and Q, its step and random stream)
    drifts: the checkpointed state is what the exact resume above rests on."""
    run = trained / "ddp_powersgd"
    assert sorted(p.name for p in (run / "split" / "checkpoints" / f"step_{STEPS}").glob("gradcomm_rank*.pt")) == [
        f"gradcomm_rank{r}.pt" for r in range(WORLD)]
    assert _differing(run / "whole", run / "forgot") != []


@pytest.mark.parametrize(("compressed", "plain"), [("ddp_bf16", "ddp"), ("hsdp_bf16", "hsdp")])
def test_bf16_compression_is_applied_and_stays_close(trained: Path, compressed: str, plain: str) -> None:
    """The bf16 runs are not the plain ones (DDP's hook, FSDP2's reduce dtype took effect), and close to them.
    (PowerSGD's run here has its own warmup; bench/grad_compression.py compares its losses.)"""
    got, expected = _losses(trained / compressed / "whole"), _losses(trained / plain / "whole")
    assert got != expected
    assert got[STEPS] == pytest.approx(expected[STEPS], rel=2e-2)
