"""Compositions with context parallelism on CPU ranks (gloo), issue 48 item 27: a mixture of experts under cp=2
(alone and with ep=2 over the same two ranks) trains to the losses, load-balancing losses and expert loads of the
same micro batches on one rank without cp, within fp32 rounding; so does cp=2 x pp=2 (4 ranks, the MoE model's
layers on two stages, validation included), and ep=2 x pp=2 trains to ep=1 x pp=2's losses; a stopped and resumed
run of each is bitwise the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from contract.errors import EXIT_STOPPED
from tests.conftest import read_metrics
from tests.dist.context_parallel_workers import run_all
from tests.dist.store import hosted_port

pytestmark = pytest.mark.dist

# moe_tiny (4 experts, top 2, dropless, both layers MoE) in fp32: 8 sequences a step, all in one micro batch, so the
# load-balancing loss is over the same tokens with and without cp.
# 10 steps (5 after a stop at 5): each equality below is per step, and a difference in the routing or the
# load-balancing loss shows from the first step on.
STEPS, STOP, PIPELINE_STEPS = 10, 5, 8
COMMON = ["model=moe_tiny", "precision=fp32", f"trainer.max_steps={STEPS}", "trainer.ckpt_every=0",
          "trainer.global_batch_size=8", "trainer.micro_batch_size=8", "trainer.prefetch_steps=0", "strategy=fsdp"]
TOLERANCE = 1e-5
# An expert takes at most half the micro batch's tokens (4 experts, top 2: exactly even routing): some are dropped.
CAPACITY = "model.moe.capacity_factor=1.0"
# A pipeline of 2 stages: 8 micro batches of one sequence a step (the plan wants 4 x pp); 8 steps, validated at 4
# and 8, stopped at 5.
PIPELINE = [*COMMON, f"trainer.max_steps={PIPELINE_STEPS}", "trainer.micro_batch_size=1", "model.tie_embeddings=false",
            "eval.every=4", "eval.batches=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("moe_cp")
    plain = {"cp1": COMMON, "pp1-cp1": PIPELINE, "cp1-capacity": [*COMMON, CAPACITY]}
    split = {"cp2": [*COMMON, "parallel.cp=2"], "cp2-ep2": [*COMMON, "parallel.cp=2", "parallel.ep=2"],
             "cp2-capacity": [*COMMON, CAPACITY, "parallel.cp=2"],
             "cp2-resumed-stopped": [*COMMON, "parallel.cp=2"], "cp2-resumed": [*COMMON, "parallel.cp=2"]}
    cp_pp = [*PIPELINE, "parallel.cp=2", "parallel.pp=2"]
    ep_pp = [*PIPELINE, "parallel.pp=2", "trainer.global_batch_size=16", "parallel.ep=2"]
    pipeline = {"pp2-cp2": cp_pp, "pp2-cp2-resumed-stopped": cp_pp, "pp2-cp2-resumed": cp_pp,
                "pp2-ep1": [*ep_pp[:-1], "parallel.ep=1"], "pp2-ep2": ep_pp, "pp2-ep2-resumed-stopped": ep_pp,
                "pp2-ep2-resumed": ep_pp}
    for world, group in ((1, plain), (2, split), (4, pipeline)):
        mp.spawn(run_all, args=(world, hosted_port(world), str(root), group, False, STOP), nprocs=world)
    return root, {name: torch.load(root / f"{name}.pt") for name in (*plain, *split, *pipeline)}


def assert_moe_runs_agree(root: Path, result: dict[str, dict], layout: str, plain: str, steps: int,
                          close: tuple[str, ...] = ("moe_aux_loss", "moe_z_loss")) -> None:
    """`layout` trained to `plain`'s losses and `close` metrics within TOLERANCE at every step, with the same expert
    loads and dropped shares exactly; a layout named *capacity* (only) dropped some."""
    reference, got = result[plain]["losses"], result[layout]["losses"]
    assert sorted(got) == sorted(reference) == list(range(1, steps + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=TOLERANCE), (layout, step)
    # The load-balancing loss is over each whole sequence: computed on each rank's chunks alone it differs by
    # percents; the loads are every rank's tokens summed (each token counted once).
    one, two = ({r["step"]: r for r in read_metrics(root / name)} for name in (plain, layout))
    assert ("capacity" in layout) == any(one[s]["moe_dropped"] > 0 for s in reference)
    for step in reference:
        for key in close:
            assert two[step][key] == pytest.approx(one[step][key], rel=TOLERANCE), (key, step)
        assert two[step]["moe_load"] == one[step]["moe_load"], step
        # With a capacity, the queues are one rank's, in the whole micro batch's token order: the same drops.
        assert two[step]["moe_dropped"] == one[step]["moe_dropped"], step


@pytest.mark.parametrize(("layout", "plain"), [("cp2", "cp1"), ("cp2-ep2", "cp1"), ("cp2-capacity", "cp1-capacity")])
def test_moe_under_cp_trains_to_the_losses_and_routing_of_cp1(runs: tuple[Path, dict[str, dict]], layout: str,
                                                              plain: str) -> None:
    root, result = runs
    assert_moe_runs_agree(root, result, layout, plain, STEPS)


def test_cp_with_pp_trains_and_validates_to_the_losses_of_one_rank(runs: tuple[Path, dict[str, dict]]) -> None:
    root, result = runs
    reference, got = result["pp1-cp1"]["losses"], result["pp2-cp2"]["losses"]
    assert sorted(got) == sorted(reference) == list(range(1, PIPELINE_STEPS + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=TOLERANCE), step
    validated = {name: [r["val/val/loss"] for r in read_metrics(root / name) if "val/val/loss" in r]
                 for name in ("pp1-cp1", "pp2-cp2")}
    assert len(validated["pp2-cp2"]) == 2
    assert validated["pp2-cp2"] == pytest.approx(validated["pp1-cp1"], rel=TOLERANCE)
    # Step 1 included: the stages' shape inference (a forward on empty tensors) is not counted (it read nan).
    one, two = ({r["step"]: r for r in read_metrics(root / name)} for name in ("pp1-cp1", "pp2-cp2"))
    for step in reference:
        assert two[step]["moe_aux_loss"] == pytest.approx(one[step]["moe_aux_loss"], rel=TOLERANCE), step
        assert two[step]["moe_load"] == one[step]["moe_load"], step


def test_ep_with_pp_trains_to_the_losses_of_ep1(runs: tuple[Path, dict[str, dict]]) -> None:
    """Each stage's experts split over its 2 data-parallel ranks; the same 4 ranks with ep=1 are the reference."""
    _, result = runs
    reference, got = result["pp2-ep1"]["losses"], result["pp2-ep2"]["losses"]
    assert sorted(got) == sorted(reference) == list(range(1, PIPELINE_STEPS + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(reference[step], rel=TOLERANCE), step


@pytest.mark.parametrize(("layout", "steps"), [("cp2", STEPS), ("pp2-cp2", PIPELINE_STEPS), ("pp2-ep2", PIPELINE_STEPS)])
def test_a_stopped_and_resumed_run_is_bitwise_the_uninterrupted_one(runs: tuple[Path, dict[str, dict]], layout: str,
                                                                    steps: int) -> None:
    _, result = runs
    stopped, resumed = result[f"{layout}-resumed-stopped"], result[f"{layout}-resumed"]
    assert stopped["exit"] == EXIT_STOPPED and max(stopped["losses"]) == STOP
    assert sorted(resumed["losses"]) == list(range(STOP + 1, steps + 1))
    assert {**stopped["losses"], **resumed["losses"]} == result[layout]["losses"]
