"""The DeepSpeed config is generated from ours; nothing here imports deepspeed."""

from __future__ import annotations

import sys

import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan
from train.strategies.deepspeed import deepspeed_config, import_deepspeed


def _ds(*overrides: str, world: int = 2) -> dict:
    # A GPU cluster of `world` ranks: fp16 with DeepSpeed is refused on CPU before the config is ever made.
    cfg, _ = compose_and_plan(["+cluster=h100x8", f"cluster.gpus_per_node={world}", *overrides])
    return deepspeed_config(cfg, world)


def test_batch_sizes_and_clipping_come_from_the_trainer() -> None:
    ds = _ds("strategy=zero2", "trainer.global_batch_size=32", "trainer.micro_batch_size=4", "optim.grad_clip=0.5")
    # DeepSpeed insists on train_batch_size == micro x accumulation x data-parallel size.
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        32, 4, 4)
    assert ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"]["stage"] == 2
    assert "offload_optimizer" not in ds["zero_optimization"] and "offload_param" not in ds["zero_optimization"]
    assert not ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    # No optimizer or scheduler section: both are ours.
    assert "optimizer" not in ds and "scheduler" not in ds


@pytest.mark.parametrize(("strategy", "stage"), [("zero1", 1), ("zero2", 2), ("zero3", 3), ("zero3_offload", 3)])
def test_stage_and_offload_follow_the_strategy(strategy: str, stage: int) -> None:
    zero = _ds(f"strategy={strategy}")["zero_optimization"]
    assert zero["stage"] == stage
    offload = strategy == "zero3_offload"
    assert zero.get("offload_optimizer") == ({"device": "cpu", "pin_memory": False} if offload else None)
    assert zero.get("offload_param") == ({"device": "cpu", "pin_memory": False} if offload else None)
    # Buckets sized by the model (tiny: d_model 64), not DeepSpeed's 5e8 elements.
    assert zero["reduce_bucket_size"] == 64 * 64
    assert ("stage3_param_persistence_threshold" in zero) == (stage == 3)


def test_precision_maps_to_deepspeed_bf16_or_fp16_with_a_dynamic_loss_scale() -> None:
    bf16 = _ds("strategy=zero2", "precision=bf16")
    assert bf16["bf16"]["enabled"] and not bf16["fp16"]["enabled"]
    fp16 = _ds("strategy=zero2", "precision=fp16")["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0 and fp16["initial_scale_power"] == 16


def test_grad_clip_zero_disables_clipping_and_world_size_one_works() -> None:
    ds = _ds("strategy=zero1", "optim.grad_clip=0", "trainer.micro_batch_size=16", world=1)
    assert ds["gradient_clipping"] == 0.0
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (16, 1)


def test_offloading_parameters_below_stage_3_is_refused() -> None:
    # Refused by the launcher's validation (exit 2 before anything runs) and, again, by the config generator.
    with pytest.raises(ConfigError, match="strategy.offload_params=true needs ZeRO stage 3, not 2"):
        _ds("strategy=zero2", "strategy.offload_params=true")
    cfg, _ = compose_and_plan(["strategy=zero2", "local.nproc=2"])
    cfg.strategy.offload_params = True
    with pytest.raises(ValueError, match="strategy.offload_params=true needs ZeRO stage 3, not 2"):
        deepspeed_config(cfg, 2)
    zero = _ds("strategy=zero2", "strategy.offload_optimizer=true")["zero_optimization"]  # ZeRO-Offload: fine
    assert zero["offload_optimizer"]["device"] == "cpu" and "offload_param" not in zero


def test_missing_deepspeed_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # makes `import deepspeed` fail as if not installed
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    with pytest.raises(ImportError, match=r"strategy=zero3 needs deepspeed: run pip install -e \.\[deepspeed\]"):
        import_deepspeed("zero3", torch.device("cpu"))
