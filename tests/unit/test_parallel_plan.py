"""The tensor x pipeline x data-parallel layout, checked and explained by the launch plan before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan
from launcher.plan.parallel import Degrees, bubble, coordinates, placement
from tests.conftest import hq, launch

H100X64 = ["+cluster=h100x64", "model=llama3_70b", "launcher.dry_run=true"]
FITS = ["strategy=fsdp", "strategy.activation_checkpointing=true", "trainer.micro_batch_size=4"]


def test_the_70b_plan_shows_layout_memory_and_bubble_and_tp_across_nodes_is_refused(tmp_path: Path) -> None:
    out = launch(*H100X64, *FITS, "parallel.tp=8", "parallel.pp=2", f"run.root={hq(tmp_path)}")
    assert out.returncode == 0, out.stderr
    text = out.stderr
    assert "layout: tensor-parallel 8 x pipeline 2 x data-parallel 4 = 64 ranks" in text
    # Tensor-parallel groups fill a node; a data-parallel replica's two stages are consecutive nodes.
    assert "node 0: ranks 0-7: dp 0 stage 0 tp 0-7" in text and "node 1: ranks 8-15: dp 0 stage 1 tp 0-7" in text
    assert "pipeline: 8 micro batches per step, bubble 11.1% of each step" in text and "warning" not in text
    assert "x data-parallel 4)" in text and "memory per rank: " in text and ": fits" in text
    refused = launch(*H100X64, *FITS, "parallel.tp=16", f"run.root={hq(tmp_path)}")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "parallel.tp=16 spans nodes of 8 GPUs" in lines[0] and "parallel.allow_cross_node_tp=true" in lines[0]


def test_the_issue_command_shows_the_plan_then_why_it_is_refused(tmp_path: Path) -> None:
    out = launch(*H100X64, "parallel.tp=8", "parallel.pp=2", f"run.root={hq(tmp_path)}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2
    assert "layout: tensor-parallel 8 x pipeline 2 x data-parallel 4 = 64 ranks" in out.stderr
    assert "bubble 11.1%" in out.stderr and "memory per rank: " in out.stderr
    assert lines[-1] == ("error: strategy=ddp does not compose with parallel.tp/pp over 4 replicas: use strategy=fsdp "
                         "(or hsdp)")
    assert list(tmp_path.iterdir()) == []


def test_model_parallelism_divides_the_memory_per_rank() -> None:
    _, alone = compose_and_plan(["+cluster=h100x64", "model=llama3_70b", *FITS, "launcher.force=true"])
    _, split = compose_and_plan(["+cluster=h100x64", "model=llama3_70b", *FITS, "parallel.tp=8", "parallel.pp=2",
                                 "launcher.dry_run=true"])
    assert alone.fit is not None and split.fit is not None
    # fsdp over 64 ranks vs fsdp over 4 ranks of a 16-way split model: the same share of the states ...
    assert split.fit.estimate.params == pytest.approx(alone.fit.estimate.params, rel=0.05)
    # ... and an eighth of the activations (tensor and sequence parallel).
    assert split.fit.estimate.activations == pytest.approx(alone.fit.estimate.activations / 8, rel=1e-6)
    assert split.data_parallel == 4 and split.global_batch_size == 4 * 8 * 4


def test_bubble_and_its_warning() -> None:
    d = Degrees(tp=1, pp=4, dp=1, ranks_per_node=4, virtual=1)
    assert bubble(d, 16) == pytest.approx(3 / 19)
    assert bubble(Degrees(1, 4, 1, 4, 2), 16) == pytest.approx(3 / 35)  # interleaved: v x m
    _, plan = compose_and_plan(["model=llama3_1b", "model.tie_embeddings=false", "local.nproc=4", "parallel.pp=4",
                                "launcher.dry_run=true", "launcher.force=true", "strategy=fsdp"])
    assert any("bubble 15.8%" in line for line in plan.layout_lines)
    _, few = compose_and_plan(["model=llama3_1b", "model.tie_embeddings=false", "local.nproc=4", "parallel.pp=4",
                               "trainer.grad_accum_steps=20", "launcher.dry_run=true", "launcher.force=true",
                               "strategy=fsdp", "parallel.pp_schedule=interleaved_1f1b"])
    assert any("bubble 7.0%" in line and "warning" not in line for line in few.layout_lines)


def test_ranks_land_tensor_parallel_first_then_stages_then_data_parallel() -> None:
    d = Degrees(tp=2, pp=1, dp=2, ranks_per_node=2, virtual=1)
    assert [coordinates(r, d) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert placement(d, 4) == ["node 0: ranks 0-1: dp 0 stage 0 tp 0-1", "node 1: ranks 2-3: dp 1 stage 0 tp 0-1"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["parallel.tp=3"], "does not divide the world size 4"),
    (["parallel.tp=4", "model.n_kv_heads=2"], "does not divide model.n_heads=4 and model.n_kv_heads=2"),
    (["parallel.pp=4", "model.n_layers=6"], "model.n_layers=6 does not split evenly over 4 pipeline chunks"),
    (["parallel.pp=2", "trainer.grad_accum_steps=4"], "needs at least 8 micro batches per step"),
    (["parallel.tp=2", "model.tie_embeddings=true"], "set model.tie_embeddings=false"),
    (["parallel.tp=2", "strategy=zero2"], "not strategy=zero2: use strategy=fsdp"),
    (["parallel.tp=2", "strategy=auto"], "not strategy=auto: use strategy=fsdp"),
    (["parallel.pp=2", "parallel.pp_schedule=gpipe"], "parallel.pp_schedule=gpipe is not one of"),
    (["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "trainer.grad_accum_steps=8", "model.n_layers=6"],
     "model.n_layers=6 does not split evenly over 4 pipeline chunks (parallel.pp=2 x 2 per stage)"),
    (["parallel.pp=4", "parallel.pp_schedule=interleaved_1f1b", "trainer.grad_accum_steps=18", "model.n_layers=8"],
     "make trainer.grad_accum_steps a multiple of 4"),
    (["parallel.tp=2", "model.position=learned"], "use model.position=rope, or parallel.tp=1"),
    (["parallel.tp=2", "strategy=ddp"], "strategy=ddp does not compose with parallel.tp/pp over 2 replicas"),
])
def test_layouts_that_cannot_run_are_refused(overrides: list[str], expected: str) -> None:
    base = ["local.nproc=4", "model.tie_embeddings=false", "model.n_layers=4", "strategy=fsdp"]
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        compose_and_plan([*base, *overrides])


def test_tensor_parallelism_across_nodes_can_be_forced_and_says_so() -> None:
    _, plan = compose_and_plan([*H100X64, *FITS, "parallel.tp=16", "parallel.allow_cross_node_tp=true",
                                "model.n_kv_heads=16"])
    assert "(tensor parallelism spans nodes: forced)" in plan.layout_lines[0]


def test_expert_parallelism_is_never_fitted_to_a_deepspeed_strategy() -> None:
    """parallel.ep>1 refuses DeepSpeed (launcher/plan/moe_plan.py): strategy=auto must not pick zero3_offload for
    it, nor may a refusal that does not fit name it as the fix."""
    mixtral = ["+cluster=h100x8", "model=mixtral_8x7b", "parallel.ep=8", "launcher.dry_run=true"]
    _, auto = compose_and_plan([*mixtral, "strategy=auto"])
    assert "no strategy fits" in auto.refusal and "zero" not in auto.refusal, auto.refusal
    _, fsdp = compose_and_plan([*mixtral, "strategy=fsdp", "strategy.activation_checkpointing=true",
                                "trainer.micro_batch_size=1"])
    # Under ep=8 each rank holds one whole expert of every layer (5.6B parameters, their gradients and AdamW's
    # moments: 90 GB), which more nodes do not shrink (issue 48, item 4): nothing fits an 80 GB GPU, and DeepSpeed
    # is never the fix named.
    assert "does not fit" in fsdp.refusal and "zero" not in fsdp.refusal, fsdp.refusal
