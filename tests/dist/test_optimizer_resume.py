"""Every optimizer (optim=adamw, sgd, adafactor, muon, lion) on 2 CPU ranks (gloo, fp32), through the real launcher:
stopped and resumed, a run equals the uninterrupted one bitwise under ddp and under fsdp, its checkpoint holds the
optimizer's own state, and the sharded run (Muon's matrices gathered for the orthogonalisation, Adafactor's factors
reduced over the shards; FSDP and tensor parallelism) trains as the replicated one does. Muon trains tiny below SGD in the same steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemReader

from contract.errors import EXIT_STOPPED
from contract.rules.optimizers import OPTIMIZERS
from contract.rundir import ckpt_layout as layout
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

STEPS, STOP = 8, 3
# A smaller model than tiny's, two blocks (Muon's matrices); the launches, not the steps, are the test's time.
SMALL = ["model.d_model=32", "model.n_layers=2", "model.ffn_hidden=64", "trainer.micro_batch_size=2",
         "trainer.log_every=1", "logger.backend=none"]
# The state each optimizer saves for one of the blocks' matrices and for the embedding.
STATE = {"sgd": ({"momentum_buffer"}, {"momentum_buffer"}),
         "adafactor": ({"row_var", "col_var"}, {"row_var", "col_var"}),
         "muon": ({"momentum_buffer"}, {"exp_avg", "exp_avg_sq"}),
         "lion": ({"exp_avg"}, {"exp_avg"})}


def _losses(run_dir: Path) -> dict[int, float]:
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def _saved_state(run_dir: Path) -> tuple[set[str], set[str]]:
    """The optimizer state keys the newest checkpoint holds for a block's matrix and for the embedding."""
    latest = layout.latest_complete_checkpoint(run_dir)
    assert latest is not None
    keys = FileSystemReader(str(latest.path / "model_optim")).read_metadata().state_dict_metadata
    matrix = {k.rsplit(".", 1)[1] for k in keys if "blocks.0.attn.q.weight." in k and ".state." in k}
    embedding = {k.rsplit(".", 1)[1] for k in keys if "embed.weight." in k and ".state." in k}
    return matrix - {"step"}, embedding - {"step"}


# adamw's resume is tested bitwise under ddp in test_preemption.py and under fsdp in test_strategies.py. Elementwise
# optimizers (sgd, lion) keep one state tensor shaped as its parameter: they are stopped and resumed under fsdp only
# (sharded state, resharded on load: the arm that can fail), their ddp run the replicated reference; muon and
# adafactor, whose sharded steps gather or reduce, are stopped and resumed under both.
RESUMED_UNDER_FSDP_ONLY = {"sgd", "lion"}


@pytest.mark.parametrize("optim", [o for o in OPTIMIZERS if o != "adamw"])
def test_stopped_and_resumed_equals_uninterrupted_under_ddp_and_fsdp(optim: str, run_root: Path) -> None:
    whole: dict[str, dict[int, float]] = {}
    for strategy in ("ddp", "fsdp"):
        common = [f"optim={optim}", f"strategy={strategy}", *SMALL, "local.nproc=2", f"trainer.max_steps={STEPS}",
                  f"run.root={hq(run_root)}"]
        out = launch(*common, f"run.name={strategy}-whole")
        assert out.returncode == 0, out.stderr[-3000:]
        whole[strategy] = _losses(run_root / f"{strategy}-whole")
        assert sorted(whole[strategy]) == list(range(1, STEPS + 1))
        assert whole[strategy][STEPS] < whole[strategy][1]  # it trains
        if strategy == "ddp" and optim in RESUMED_UNDER_FSDP_ONLY:
            continue
        first = launch(*common, f"run.name={strategy}-split", SLURMTRAIN_TEST_SIGNAL=f"{STOP}:1")
        assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
        assert _saved_state(run_root / f"{strategy}-split") == STATE[optim]
        second = launch(*common, f"run.name={strategy}-split")
        assert second.returncode == 0, second.stderr[-3000:]
        assert "resumed from" in second.stderr and f"step {STOP}," in second.stderr
        assert _losses(run_root / f"{strategy}-split") == whole[strategy]  # float equality: bitwise
    for step in range(1, STEPS + 1):  # sharded as replicated, up to the order of the sums
        assert whole["fsdp"][step] == pytest.approx(whole["ddp"][step], rel=1e-4), (optim, step)


@pytest.mark.parametrize("optim", ["adafactor", "muon"])
def test_an_fsdp_checkpoint_resumes_on_another_world_size(optim: str, run_root: Path) -> None:
    """Stopped on 2 ranks, resumed on 1 with the same global batch: DCP reshards the optimizer state."""
    common = [f"optim={optim}", "strategy=fsdp", *SMALL, "trainer.global_batch_size=4", f"trainer.max_steps={STEPS}",
              f"run.root={hq(run_root)}"]
    out = launch(*common, "local.nproc=2", "run.name=whole")
    assert out.returncode == 0, out.stderr[-3000:]
    first = launch(*common, "local.nproc=2", "run.name=moved", SLURMTRAIN_TEST_SIGNAL=f"{STOP}:1")
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    second = launch(*common, "local.nproc=1", "run.name=moved")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and f"step {STOP}," in second.stderr
    got, expected = _losses(run_root / "moved"), _losses(run_root / "whole")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(expected[step], rel=1e-4), (step, got, expected)


@pytest.mark.parametrize("optim", [o for o in OPTIMIZERS if o != "adamw"])
def test_tensor_parallel_trains_as_fsdp_alone(optim: str, run_root: Path) -> None:
    """tp=2 (each block's matrices split by rows or columns: Muon gathers them, Adafactor reduces its factors over
    them) against fsdp over the same 2 ranks, the same global batch."""
    losses = {}
    for tp in (1, 2):
        out = launch(f"optim={optim}", "strategy=fsdp", f"parallel.tp={tp}", "model.tie_embeddings=false", *SMALL,
                     "trainer.global_batch_size=4", "local.nproc=2", "trainer.max_steps=4", f"run.root={hq(run_root)}",
                     f"run.name=tp{tp}")
        assert out.returncode == 0, out.stderr[-3000:]
        losses[tp] = _losses(run_root / f"tp{tp}")
    assert sorted(losses[2]) == [1, 2, 3, 4]
    for step in range(1, 5):
        assert losses[2][step] == pytest.approx(losses[1][step], rel=1e-4), (optim, step, losses)


@pytest.mark.parametrize("optim", ["sgd", "lion"])
def test_zero_steps_the_elementwise_optimizers_as_ddp_does(optim: str, run_root: Path) -> None:
    """DeepSpeed steps its client optimizer on flat partitions: an elementwise update is the same there."""
    losses = {}
    for strategy in ("ddp", "zero2"):
        out = launch(f"optim={optim}", f"strategy={strategy}", *SMALL, "local.nproc=2", "trainer.max_steps=4",
                     f"run.root={hq(run_root)}", f"run.name={strategy}")
        assert out.returncode == 0, out.stderr[-3000:]
        losses[strategy] = _losses(run_root / strategy)
    assert sorted(losses["zero2"]) == [1, 2, 3, 4]
    for step in range(1, 5):
        assert losses["zero2"][step] == pytest.approx(losses["ddp"][step], rel=1e-5), (optim, step, losses)


def test_muon_trains_tiny_below_sgd_in_the_same_steps(run_root: Path) -> None:
    """Each at its conf/optim defaults, the same seed and data: the mean loss of the last 5 of 30 steps."""
    final = {}
    for optim in ("sgd", "muon"):
        out = launch(f"optim={optim}", "model=tiny", "trainer.max_steps=30", "trainer.seed=7", "trainer.log_every=1",
                     "local.nproc=1", "logger.backend=none", f"run.root={hq(run_root)}", f"run.name={optim}")
        assert out.returncode == 0, out.stderr[-3000:]
        losses = _losses(run_root / optim)
        assert losses[1] == pytest.approx(_losses(run_root / "sgd")[1])  # the same start
        final[optim] = sum(losses[k] for k in range(26, 31)) / 5
    assert final["muon"] < 0.8 * final["sgd"], final
