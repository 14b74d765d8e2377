"""strategy.grad_compression: what `auto` becomes, what each strategy refuses, the plan's line (contract/rules)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from contract.rules.grad_compression import plan_lines, refusal, resolve


def _strategy(name: str, compression: str = "auto", backend: str = "torch") -> object:
    return OmegaConf.create({"name": name, "backend": backend, "grad_compression": compression, "powersgd_rank": 4})


@pytest.mark.parametrize(("strategy", "precision", "nodes", "expected"), [
    ("ddp", "fp32", 8, "none"),  # full precision asked for: never compressed by default
    ("ddp", "bf16", 1, "none"),  # one node: nothing worth halving
    ("ddp", "bf16", 2, "bf16"),
    ("fsdp", "fp8", 4, "bf16"),
    ("hsdp", "fp16", 4, "fp16"),  # loss-scaled into fp16's range
    ("single", "bf16", 4, "none"),
])
def test_auto_follows_the_compute_dtype_across_nodes_only(strategy: str, precision: str, nodes: int,
                                                           expected: str) -> None:
    kind, why = resolve(_strategy(strategy), precision, nodes)
    assert kind == expected
    assert why  # auto always says why
    assert resolve(_strategy("zero2", backend="deepspeed"), "bf16", 4)[0] == "none"
    assert resolve(_strategy(strategy, "powersgd"), precision, nodes) == ("powersgd", "")  # a choice is kept


def test_each_strategy_refuses_what_it_cannot_honour() -> None:
    assert refusal(_strategy("ddp", "powersgd")) is None
    assert refusal(_strategy("hsdp", "bf16")) is None
    assert "strategy=ddp" in (refusal(_strategy("fsdp", "powersgd")) or "")
    assert "DeepSpeed" in (refusal(_strategy("zero2", "fp16", backend="deepspeed")) or "")
    assert refusal(_strategy("zero2", "auto", backend="deepspeed")) is None
    assert "has none" in (refusal(_strategy("single", "bf16")) or "")


def test_the_plan_names_the_wire_format_only_where_ranks_average() -> None:
    cfg = OmegaConf.create({"strategy": _strategy("ddp", "powersgd"), "precision": {"name": "fp32"}})
    (line,) = plan_lines(cfg, 4, 1)
    assert "PowerSGD rank-4" in line and "over 4 data-parallel ranks" in line
    assert plan_lines(cfg, 1, 1) == ()


def test_with_replica_groups_the_plan_says_the_groups_average_is_not_compressed() -> None:
    """A new user's trial: with replica groups the plan said bf16 halved the bytes of an average that torchft does in
    the gradients' own dtype, with nothing to compress at one data-parallel rank per group."""
    cfg = OmegaConf.create({"strategy": _strategy("ddp", "bf16"), "precision": {"name": "fp32"},
                            "parallel": {"replica_groups": 2}})
    (alone,) = plan_lines(cfg, 2, 1)
    assert "half the bytes" not in alone and "nothing to compress (one data-parallel rank per group)" in alone
    (inner,) = plan_lines(cfg, 4, 1)
    assert "over each group's 2 data-parallel ranks in bf16" in inner and "never compressed" in inner
