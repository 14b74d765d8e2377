"""A key the chosen options never read is refused, naming the choice that reads it (issue 48, item 19): accepted in
silence it did nothing and still changed the run's name. Every shipped option of every group, with its own YAML
values, is accepted (the table may not refuse what a group file sets)."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from launcher.checks.group_names import CONF_DIR
from launcher.checks.unread_keys import READERS, check_unread_keys, default
from launcher.compose import compose_and_plan, compose_config

REFUSED = [
    (["model.moe.capacity_factor=1.25"], "model.moe.capacity_factor=1.25 has no effect with model=tiny, a dense model",
     "model.moe.num_experts=N"),
    (["model.moe.top_k=3"], "model.moe.top_k=3 has no effect with model=tiny, a dense model", "model=moe_tiny"),
    (["precision=fp32", "precision.float8_recipe=rowwise"],
     "precision.float8_recipe=rowwise has no effect with precision=fp32", "choose precision=fp8"),
    (["model=gpt2_124m", "model.rope_theta=500000"], "model.rope_theta=500000 has no effect with "
     "model.position=learned", "set model.position=rope"),
    (["strategy=fsdp", "strategy.bucket_cap_mb=50"], "strategy.bucket_cap_mb=50 has no effect with strategy=fsdp",
     "choose strategy=ddp"),
    (["strategy=ddp", "strategy.reshard_after_forward=false"], "has no effect with strategy=ddp", "strategy=fsdp"),
    (["strategy=fsdp", "strategy.replicate_degree=2"], "strategy.replicate_degree=2 has no effect", "strategy=hsdp"),
    (["strategy=ddp", "strategy.offload_optimizer=true"], "strategy=ddp, not DeepSpeed's", "zero3_offload"),
    # strategy=auto picks a strategy with its own settings: a typed ZeRO stage or resharding was dropped by the pick.
    (["strategy=auto", "strategy.zero_stage=2"], "strategy.zero_stage=2 has no effect with strategy=auto, which picks "
     "the strategy and sets its own", "strategy=zero1, zero2"),
    (["strategy=auto", "strategy.reshard_after_forward=false"], "has no effect with strategy=auto",
     "choose strategy=fsdp, fsdp_grad_op or hsdp"),
    (["parallel.pp_schedule=interleaved_1f1b"], "has no effect with parallel.pp=1", "parallel.pp=N"),
    (["parallel.pp_virtual_stages=4"], "has no effect with parallel.pp_schedule=1f1b", "interleaved_1f1b"),
    (["parallel.allow_cross_node_tp=true"], "has no effect with parallel.tp=1", "parallel.tp=N"),
    (["data=tokens", "data.signal=0.5"], "data.signal=0.5 has no effect with data=tokens", "data=synthetic"),
    (["data.shuffle=false"], "data.shuffle=false has no effect with data=synthetic", "data=tokens"),
    (["data.dtype=uint32"], "data.dtype=uint32 has no effect with data=synthetic", "data=tokens"),
    (["parallel.replica_timeout_s=99"], "parallel.replica_timeout_s=99 has no effect with parallel.replica_groups=1",
     "parallel.replica_groups=N"),
    # Validation's keys with validation off, telemetry's straggler rule with telemetry off (a new user's trial).
    (["eval.batches=3"], "eval.batches=3 has no effect with eval.every=0", "set eval.every=N"),
    (["eval.sets.held.kind=synthetic"], "eval.sets.held.kind=synthetic has no effect with eval.every=0",
     "set eval.every=N"),
    (["eval.job_nodes=2"], "eval.job_nodes=2 has no effect with eval.async_jobs=false", "set eval.async_jobs=true"),
    (["telemetry.enabled=false", "telemetry.straggler_factor=2"], "telemetry.straggler_factor=2 has no effect with "
     "telemetry.enabled=false", "drop telemetry.enabled=false"),
]


@pytest.mark.parametrize(("overrides", "said", "fix"), REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_a_key_nothing_reads_is_refused(overrides: list[str], said: str, fix: str) -> None:
    with pytest.raises(ConfigError) as refused:
        compose_and_plan(overrides)
    assert said in str(refused.value) and fix in str(refused.value), str(refused.value)


def test_the_same_keys_are_accepted_where_they_are_read() -> None:
    for overrides in (["model=moe_tiny", "model.moe.top_k=1", "model.moe.capacity_factor=1.25"],
                      ["model=gpt2_124m", "model.position=rope", "model.rope_theta=500000", "model.max_seq_len=64",
                       "model.n_layers=1", "model.d_model=64", "model.n_heads=4", "model.vocab_size=256",
                       "model.ffn_hidden=128"],
                      ["strategy=ddp", "strategy.bucket_cap_mb=50"], ["strategy=auto", "strategy.bucket_cap_mb=50"],
                      ["eval.every=5", "eval.batches=3"], ["eval.at_start=true", "eval.batches=2"],
                      ["telemetry.enabled=false", "telemetry.peak_tflops=3"]):
        compose_and_plan(overrides)


@pytest.mark.parametrize("group", ["model", "strategy", "precision", "data", "optim"])
def test_every_shipped_option_is_accepted_with_its_own_values(group: str) -> None:
    for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
        check_unread_keys(compose_config([f"{group}={option}"]))


def test_every_key_in_the_table_is_declared_with_a_default() -> None:
    for reader in READERS:
        for key in reader.keys:
            default(key)  # raises for a key the schema does not declare
