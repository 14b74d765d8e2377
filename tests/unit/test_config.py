"""Compose-time and validation behaviour of `python -m launcher`."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.compose import compose_and_plan, compose_config
from launcher.plan.launch_plan import make_plan
from launcher.plan.run_name import derived_run_name

MODELS = ["tiny", "gpt2_124m", "gpt2_350m", "llama3_1b", "llama3_8b", "llama3_70b"]


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_composes_and_validates(model: str) -> None:
    cfg, plan = compose_and_plan([f"model={model}", "local.nproc=1", "launcher.force=true"])
    assert cfg.model.name == model
    assert plan.seq_len == cfg.model.max_seq_len


def test_global_batch_derives_accumulation() -> None:
    cfg, plan = compose_and_plan(["trainer.global_batch_size=64", "trainer.micro_batch_size=4", "local.nproc=2"])
    assert plan.grad_accum_steps == 8 and cfg.trainer.grad_accum_steps == 8
    assert plan.global_batch_size == 64


def test_conflicting_accumulation_is_refused() -> None:
    cfg = compose_config(["trainer.global_batch_size=64", "trainer.micro_batch_size=4", "local.nproc=2",
                          "trainer.grad_accum_steps=2"])
    with pytest.raises(ConfigError, match="drop one of them"):
        make_plan(cfg)


def test_derived_run_name_is_stable_and_tracks_training_settings() -> None:
    base = derived_run_name(compose_config([]))
    assert base == derived_run_name(compose_config([]))
    assert base.startswith("tiny-ddp-fp32-")
    # Settings that don't change what is trained keep the name (so the same run resumes) ...
    assert base == derived_run_name(compose_config(["trainer.max_steps=999", "trainer.log_every=1"]))
    # ... settings that do, change it.
    assert base != derived_run_name(compose_config(["optim.lr=1e-4"]))


def test_print_config_does_not_import_torch() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "--cfg", "job"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert OmegaConf.create(out.stdout).model.name == "tiny"
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp", "fsdp_grad_op", "hsdp", "zero1", "zero2", "zero3",
                                      "zero3_offload"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_strategy_and_precision_composes(strategy: str, precision: str) -> None:
    cfg, _ = compose_and_plan([f"strategy={strategy}", f"precision={precision}", "+cluster=h100x8",
                               "cluster.gpus_per_node=1"])
    assert cfg.strategy.name == strategy and cfg.precision.name == precision


def test_unknown_strategy_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="choose one of single, ddp"):
        compose_and_plan(["strategy.name=megatron"])


def test_slurm_plan_states_the_gpu_hours_it_reserves() -> None:
    _, plan = compose_and_plan(["+cluster=a100x16", "cluster.time_limit_min=120"])
    assert plan.gpus == 16 and plan.gpu_hours == 32
    assert "reserves 16 GPUs for up to 2 h = 32 GPU-hours per attempt (about $64 at $2/GPU-hour)" in plan.summary()
    _, local = compose_and_plan(["local.nproc=1"])
    assert "GPU-hours" not in local.summary()


@pytest.mark.parametrize("override", ["trainer.global_batch_size=0", "model.n_heads=0", "data.seq_len=0"])
def test_zero_sizes_are_refused(override: str) -> None:
    with pytest.raises(ConfigError, match="to a value at least 1"):
        compose_and_plan([override])


def test_every_numeric_key_declares_its_range() -> None:
    from launcher.checks.key_checks import numeric_keys_without_range

    assert numeric_keys_without_range() == []


def test_upgrading_keeps_derived_run_names() -> None:
    """A config.yaml written before keys were added (here: without every key added since the first release)
    names the same run as today's config with those keys at their defaults; so the same command still resumes."""
    from omegaconf import OmegaConf

    from launcher.compose import compose_config
    from launcher.plan.run_name import NAME_ONLY_IF_SET, derived_run_name

    cfg = compose_config(["local.nproc=2"])
    old = OmegaConf.to_container(cfg, resolve=True)
    for key in [*NAME_ONLY_IF_SET, "optim.scaled_lr", "logger.group", "telemetry", "profile", "trainer.prefetch_steps"]:
        node = old
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        del node[leaf]
    assert derived_run_name(OmegaConf.create(old)) == derived_run_name(cfg)
    changed = compose_config(["local.nproc=2", "optim.lr_scaling=sqrt", "optim.reference_batch_size=8"])
    assert derived_run_name(changed) != derived_run_name(cfg)
