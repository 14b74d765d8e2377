"""The memory plan under expert parallelism counts num_experts / ep experts per rank (issue 48, item 4): it counted
every expert on every rank, so a run that fits could be refused and a Mixtral-class plan misled. The experts a rank
holds are counted from the model the ranks build (train/strategies/expert_parallel.py keeps E / ep of them, whole,
outside the strategy's sharding)."""

from __future__ import annotations

import pytest

from contract.rules.moe_shape import expert_params
from launcher.compose import compose_config
from launcher.plan.cross_checks import count_parameters
from launcher.plan.estimate import FP32, ModelShape, estimate_memory
from train.model.transformer import build_model

MOE = ["model=moe_tiny", "model.moe.num_experts=8", "precision=fp32", "optim=adamw"]


def _estimate(strategy: str, ep: int, world: int = 4):  # type: ignore[no-untyped-def]
    cfg = compose_config([*MOE, f"strategy={strategy}", f"parallel.ep={ep}"])
    n = count_parameters(cfg.model)
    return cfg, n, estimate_memory(cfg, world, 1, ModelShape.ours(cfg.model, n), margin_bytes=0, fragmentation=0)


def test_expert_params_are_the_experts_the_model_builds() -> None:
    cfg = compose_config(MOE)
    model = build_model(cfg.model)
    built = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert built > 0 and expert_params(cfg.model) == built


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_holds_num_experts_over_ep_experts(strategy: str) -> None:
    cfg, n, one = _estimate(strategy, 1)
    _, _, four = _estimate(strategy, 4)
    experts = expert_params(cfg.model)
    dense = n - experts
    # ep=1: the strategy's layout for every parameter (DDP: all of them; FSDP: a quarter each).
    shard = 1 if strategy == "ddp" else 4
    assert one.params == pytest.approx(FP32 * n / shard)
    # ep=4: the dense parameters as before, and 8 / 4 = 2 experts of each MoE layer, whole, with their gradients
    # and AdamW's two moments.
    assert four.params == pytest.approx(FP32 * (dense / shard + experts / 4))
    assert four.grads == pytest.approx(FP32 * (dense / shard + experts / 4))
    assert four.optimizer == pytest.approx(2 * FP32 * (dense / shard + experts / 4), rel=1e-6)
    if strategy == "ddp":
        assert four.states < one.states
