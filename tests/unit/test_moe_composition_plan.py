"""Issue 48 item 27 in the launch plan: a mixture of experts with context parallelism (and ep over the same ranks)
is planned and shown, and so are cp with pp, ep with pp and MoE with tp (ep too); a sequence that can't split into
equal tp slices is refused in one line that says why and names the fix."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan

MOE = ["model=moe_tiny", "strategy=fsdp", "launcher.dry_run=true"]


def test_moe_with_cp_and_ep_is_planned_and_shown_in_the_layout() -> None:
    _, plan = compose_and_plan([*MOE, "local.nproc=4", "parallel.cp=2", "parallel.ep=2",
                                "model.moe.capacity_factor=1.25"])
    assert plan.refusal in (None, ""), plan.refusal
    assert "cp 2: the load-balancing loss over whole sequences" in plan.moe_line
    assert "ep 2: 2 experts per rank" in plan.moe_line
    assert any("context-parallel 2" in line for line in plan.layout_lines), plan.layout_lines


def test_cp_with_pp_is_planned_and_shown_in_the_layout() -> None:
    _, plan = compose_and_plan([*MOE, "local.nproc=4", "parallel.cp=2", "parallel.pp=2", "model.tie_embeddings=false",
                                "trainer.global_batch_size=8", "trainer.micro_batch_size=1"])
    text = "\n".join(plan.layout_lines)
    assert "layout: tensor-parallel 1 x pipeline 2 x context-parallel 2 x data-parallel 1 = 4 ranks" in text, text
    assert "dp 0 cp 0 stage 0 tp 0; dp 0 cp 0 stage 1 tp 0; dp 0 cp 1 stage 0 tp 0; dp 0 cp 1 stage 1 tp 0" in text
    assert "2 ranks of a stage (x pipeline 2 x tensor-parallel 1) x data-parallel 1 = 4 ranks" in text
    assert "pipeline: 8 micro batches per step" in text


def test_ep_with_pp_is_planned_and_shown() -> None:
    _, plan = compose_and_plan([*MOE, "local.nproc=4", "parallel.ep=2", "parallel.pp=2", "model.tie_embeddings=false",
                                "trainer.global_batch_size=16", "trainer.micro_batch_size=1"])
    assert "ep 2: 2 experts per rank of a stage" in plan.moe_line, plan.moe_line
    assert any("tensor-parallel 1 x pipeline 2 x data-parallel 2 = 4 ranks" in line for line in plan.layout_lines)


def test_moe_with_tp_and_ep_is_planned_with_the_layers_whole_per_tp_rank() -> None:
    _, plan = compose_and_plan([*MOE, "local.nproc=4", "parallel.tp=2", "parallel.ep=2"])
    assert plan.refusal in (None, ""), plan.refusal
    assert "ep 2: 2 experts per rank of a tp index" in plan.moe_line, plan.moe_line
    assert "tp 2: each tp rank routes its slice of the sequence" in plan.moe_line, plan.moe_line
    assert any("tensor-parallel 2 x pipeline 1 x data-parallel 2 = 4 ranks" in line for line in plan.layout_lines)


def test_the_memory_plan_counts_a_moe_layer_whole_on_every_tp_rank() -> None:
    """Attention splits over tp, the experts don't: a rank's parameters under tp=2 are more than half of tp=1's."""
    from contract.rules.moe_shape import mlp_params

    cfg, one = compose_and_plan([*MOE, "local.nproc=1"])
    _, two = compose_and_plan([*MOE, "local.nproc=2", "parallel.tp=2"])
    held_one, held_two = one.fit.estimate.params, two.fit.estimate.params
    experts = mlp_params(cfg.model) / one.n_params * held_one  # the feed-forwards' share of tp=1's bytes
    assert held_two == pytest.approx((held_one - experts) / 2 + experts, rel=0.05), (held_one, held_two)


@pytest.mark.parametrize(("overrides", "says"), [
    (["local.nproc=2", "parallel.tp=2", "data.seq_len=63"], "does not split into parallel.tp=2 equal slices"),
    (["local.nproc=8", "parallel.tp=4", "parallel.cp=2", "data.seq_len=60"], "of each of its parallel.cp=2 shares"),
])
def test_what_can_not_run_is_refused_in_one_line(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        compose_and_plan([*MOE, *overrides])
    message = str(refused.value)
    assert says in message and "\n" not in message and "use " in message, message


@pytest.mark.parametrize(("overrides", "says"), [
    # The layout's own rule comes first: seq_len advice would not help.
    (["local.nproc=3", "parallel.tp=3"], "parallel.tp=3 does not divide model.n_heads=4"),
    # The rule under cp x tp: 2 x cp chunks, each cp share in tp slices (a multiple of 8 here, 40 runs).
    (["local.nproc=8", "parallel.tp=4", "parallel.cp=2", "data.seq_len=36"], "a multiple of 8"),
    (["local.nproc=2", "parallel.ep=2", "precision=fp16"], "precision=fp16 with parallel.ep=2 under strategy=fsdp"),
    (["local.nproc=2", "parallel.tp=2", "strategy.compile=true"], "strategy.compile=true with parallel.tp=2 on CPU"),
])
def test_a_new_users_bad_inputs_get_the_rule_that_applies(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        compose_and_plan([*MOE, *overrides])
    message = str(refused.value)
    assert says in message and "\n" not in message and ("use " in message or "pick " in message), message


def test_cp_by_tp_takes_the_sequence_the_rule_names() -> None:
    _, plan = compose_and_plan([*MOE, "local.nproc=8", "parallel.tp=4", "parallel.cp=2", "data.seq_len=40"])
    assert plan.refusal in (None, ""), plan.refusal
