"""Compose-time and validation behaviour of `python -m launcher`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.compose import compose_and_plan, compose_config
from launcher.errors import ConfigError
from launcher.plan import derived_run_name, make_plan
from tests.conftest import hq, launch

MODELS = ["tiny", "gpt2_124m", "gpt2_350m", "llama3_1b", "llama3_8b", "llama3_70b"]


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_composes_and_validates(model: str) -> None:
    cfg, plan = compose_and_plan([f"model={model}", "local.nproc=1", "launcher.force=true"])
    assert cfg.model.name == model
    assert plan.seq_len == cfg.model.max_seq_len


def test_bad_group_choice_names_the_valid_choices_and_creates_nothing(run_root: Path) -> None:
    out = launch("strategy=nope", f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert "Could not find 'strategy/nope'" in out.stderr
    assert "ddp" in out.stderr and "single" in out.stderr
    assert list(run_root.iterdir()) == []


def test_misspelled_key_is_named_and_creates_nothing(run_root: Path) -> None:
    out = launch("trainer.max_step=5", f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert "max_step" in out.stderr and "TrainerConfig" in out.stderr
    assert list(run_root.iterdir()) == []


def test_wrong_type_fails_at_compose_time(run_root: Path) -> None:
    out = launch("trainer.max_steps=many", f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert "max_steps" in out.stderr


def test_global_batch_that_does_not_divide_is_one_line_exit_2(run_root: Path) -> None:
    out = launch("trainer.global_batch_size=20", "trainer.micro_batch_size=8", "local.nproc=2",
                 f"run.root={hq(run_root)}")
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "multiple of 16" in errors[0]
    assert list(run_root.iterdir()) == []


def test_global_batch_derives_accumulation() -> None:
    cfg, plan = compose_and_plan(["trainer.global_batch_size=64", "trainer.micro_batch_size=4", "local.nproc=2"])
    assert plan.grad_accum_steps == 8 and cfg.trainer.grad_accum_steps == 8
    assert plan.global_batch_size == 64


def test_conflicting_accumulation_is_refused() -> None:
    cfg = compose_config(["trainer.global_batch_size=64", "trainer.micro_batch_size=4", "local.nproc=2",
                          "trainer.grad_accum_steps=2"])
    with pytest.raises(ConfigError, match="drop one of them"):
        make_plan(cfg)


def test_single_strategy_refuses_several_ranks() -> None:
    with pytest.raises(ConfigError, match="use strategy=ddp"):
        compose_and_plan(["strategy=single", "local.nproc=2"])


def test_tokens_data_needs_a_path() -> None:
    with pytest.raises(ConfigError, match="data.path="):
        compose_and_plan(["data=tokens"])


def test_seq_len_longer_than_model_context_is_refused() -> None:
    with pytest.raises(ConfigError, match="data.seq_len<=64"):
        compose_and_plan(["data.seq_len=128"])


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


def test_hsdp_replicas_must_divide_the_world() -> None:
    with pytest.raises(ConfigError, match="pick a divisor of 4"):
        compose_and_plan(["strategy=hsdp", "strategy.replicate_degree=3", "local.nproc=4"])


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
    with pytest.raises(ConfigError, match="must be at least 1"):
        compose_and_plan([override])


def test_upgrading_keeps_derived_run_names() -> None:
    """A config.yaml written before keys were added (here: without every key added since the first release)
    names the same run as today's config with those keys at their defaults; so the same command still resumes."""
    from omegaconf import OmegaConf

    from launcher.compose import compose_config
    from launcher.plan import NAME_ONLY_IF_SET, derived_run_name

    cfg = compose_config(["local.nproc=2"])
    old = OmegaConf.to_container(cfg, resolve=True)
    for key in [*NAME_ONLY_IF_SET, "optim.scaled_lr", "logger.group", "telemetry", "profile"]:
        node = old
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        del node[leaf]
    assert derived_run_name(OmegaConf.create(old)) == derived_run_name(cfg)
    changed = compose_config(["local.nproc=2", "optim.lr_scaling=sqrt", "optim.reference_batch_size=8"])
    assert derived_run_name(changed) != derived_run_name(cfg)
