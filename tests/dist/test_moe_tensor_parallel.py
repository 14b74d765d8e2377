"""A mixture of experts under tensor parallelism on CPU ranks (gloo), issue 48 item 27: each tp rank routes its slice
of the sequence with the MoE layers whole (train/strategies/tensor_parallel.py). tp=2 trains to one rank's losses,
load-balancing and z-losses and expert loads, dropless and with a capacity that drops (the same choices dropped);
ep=2 x tp=2 trains to the losses of the same two data-parallel replicas without tp or ep; pp=2 x tp=2 and
cp=2 x tp=2 (with a capacity) to one rank's; a stopped and resumed ep x tp run is bitwise the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from tests.dist.context_parallel_workers import run_all
from tests.dist.store import hosted_port
from tests.dist.test_moe_compositions import assert_moe_runs_agree

pytestmark = pytest.mark.dist

# moe_tiny (4 experts, top 2, both layers MoE) in fp32; 8 steps, stopped at 4 for the resume. A difference in the
# routing, the load-balancing loss or the summed gradients shows in the first steps' losses and norms.
STEPS, STOP = 8, 4
COMMON = ["model=moe_tiny", "precision=fp32", f"trainer.max_steps={STEPS}", "trainer.ckpt_every=0",
          "trainer.global_batch_size=8", "trainer.micro_batch_size=8", "trainer.prefetch_steps=0", "strategy=fsdp"]
CAPACITY = "model.moe.capacity_factor=1.0"  # an expert takes at most half the tokens: some are dropped
# Two data-parallel replicas of 4 sequences each: the load-balancing loss is over each replica's micro batch.
REPLICAS = [*COMMON, "trainer.micro_batch_size=4"]
# A pipeline: 8 micro batches of one sequence a step.
PIPELINE = [*COMMON, "trainer.micro_batch_size=1", "model.tie_embeddings=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("moe_tp")
    one = {"tp1": COMMON, "tp1-capacity": [*COMMON, CAPACITY], "pp1": PIPELINE}
    two = {"tp2": [*COMMON, "parallel.tp=2"], "tp2-capacity": [*COMMON, CAPACITY, "parallel.tp=2"], "dp2": REPLICAS}
    ep_tp = [*REPLICAS, "parallel.tp=2", "parallel.ep=2"]
    four = {"dp2-tp2-ep2": ep_tp, "dp2-tp2-ep2-resumed-stopped": ep_tp, "dp2-tp2-ep2-resumed": ep_tp,
            "pp2-tp2": [*PIPELINE, "parallel.pp=2", "parallel.tp=2"],
            "cp2-tp2-capacity": [*COMMON, CAPACITY, "parallel.cp=2", "parallel.tp=2"]}
    for world, group in ((1, one), (2, two), (4, four)):
        mp.spawn(run_all, args=(world, hosted_port(world), str(root), group, False, STOP), nprocs=world)
    return root, {name: torch.load(root / f"{name}.pt") for name in (*one, *two, *four)}


@pytest.mark.parametrize(("layout", "plain"), [("tp2", "tp1"), ("tp2-capacity", "tp1-capacity"),
                                               ("dp2-tp2-ep2", "dp2"), ("pp2-tp2", "pp1"),
                                               ("cp2-tp2-capacity", "tp1-capacity")])
def test_moe_under_tp_trains_to_the_losses_and_routing_without_it(runs: tuple[Path, dict[str, dict]], layout: str,
                                                                  plain: str) -> None:
    root, result = runs
    # The gradients summed over tp: the norm is the one without tp (a missing sum would halve it).
    assert_moe_runs_agree(root, result, layout, plain, STEPS, close=("grad_norm", "moe_aux_loss", "moe_z_loss"))


def test_a_stopped_and_resumed_ep_by_tp_run_is_bitwise_the_uninterrupted_one(
        runs: tuple[Path, dict[str, dict]]) -> None:
    _, result = runs
    stopped, resumed = result["dp2-tp2-ep2-resumed-stopped"], result["dp2-tp2-ep2-resumed"]
    assert stopped["exit"] == EXIT_STOPPED and max(stopped["losses"]) == STOP
    assert sorted(resumed["losses"]) == list(range(STOP + 1, STEPS + 1))
    assert {**stopped["losses"], **resumed["losses"]} == result["dp2-tp2-ep2"]["losses"]
