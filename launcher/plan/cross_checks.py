"""The plan's cross-field checks that need no world layout: the model's shape (ours counted, a Hugging Face
config applied), the strategy against what is installed and the world, the batch against the world
(the accumulation it implies), the world size itself.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.compile_modes import compile_refusal
from contract.rules.hf_config import HF_TARGET, apply_hf_config
from contract.rules.hf_export import refuse_unexportable
from contract.rules.moe_shape import mlp_params
from launcher.checks.overrides import typed_for
from launcher.plan.parallel import (
    MIN_MICRO_PER_STAGE,
)
from launcher.plan.world import has_gpus, ranks_on_gpus


def count_parameters(m: Any) -> int:
    d, v, layers = m.d_model, m.vocab_size, m.n_layers
    head_dim = d // m.n_heads
    kv_heads = m.n_kv_heads or m.n_heads
    attn = d * d + 2 * kv_heads * head_dim * d + d * d
    norm = d if m.norm == "rmsnorm" else 2 * d
    # Every expert of a mixture of experts (contract/rules/moe_shape.py): memory holds them all.
    total = v * d + layers * (attn + 2 * norm) + mlp_params(m) + norm
    if m.position == "learned":
        total += m.max_seq_len * d
    if not m.tie_embeddings:
        total += v * d
    return total


def _check_model(cfg: DictConfig) -> None:
    m = cfg.model
    if m.get("_target_") == HF_TARGET and not m.config_path:
        raise ConfigError(f"model={m.name} needs a local Hugging Face config: add model.config_path=PATH "
                          "(a config.json or its directory)")
    if m.config_path is not None:
        apply_hf_config(cfg, [k for k in ("vocab_size", "max_seq_len") if typed_for(f"model.{k}") is not None])
    if cfg.checkpoint.get("export_hf"):
        refuse_unexportable(m, "checkpoint.export_hf=true", "drop it, and export checkpoints with python -m "
                            "launcher.export --format safetensors")
    if m.get("_target_"):
        return
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}")
    if m.n_kv_heads and m.n_heads % m.n_kv_heads:
        raise ConfigError(f"model.n_heads={m.n_heads} is not a multiple of model.n_kv_heads={m.n_kv_heads}")
    if m.position == "rope" and (m.d_model // m.n_heads) % 2:
        raise ConfigError("rope needs an even head dimension: change model.d_model or model.n_heads")
    if cfg.data.seq_len > m.max_seq_len:
        raise ConfigError(
            f"data.seq_len={cfg.data.seq_len} exceeds model.max_seq_len={m.max_seq_len}: "
            f"set data.seq_len<={m.max_seq_len}"
        )


def _check_precision(cfg: DictConfig) -> None:
    """precision=fp8: a model and strategy it converts, and GPUs with float8 tensor cores: the cluster's gpu_type
    (a dry run for an H100 cluster plans anywhere), else this machine's (contract/rules/float8.py)."""
    from contract.rules import float8

    if not float8.enabled(cfg.precision):
        return
    refusal = float8.config_refusal(cfg)
    if refusal is None and cfg.cluster is not None:
        refusal = float8.gpu_refusal(cfg.cluster.get("gpu_type"), None, f"cluster {cfg.cluster.name}")
    elif refusal is None:
        from launcher.plan.world import local_gpu_capability

        refusal = float8.gpu_refusal(None, local_gpu_capability(), "this machine")
    if refusal:
        raise ConfigError(refusal)


def _check_strategy(cfg: DictConfig, world: int) -> None:
    from contract.rules.optimizers import strategy_refusal
    from contract.rules.strategy_names import REGISTRY

    s = cfg.strategy
    if s.name not in REGISTRY:
        raise ConfigError(f"strategy.name={s.name} is unknown: choose one of {', '.join(REGISTRY)}")
    if s.backend == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"strategy={s.name} needs deepspeed: run `pip install -e .[deepspeed]`")
    if s.backend == "deepspeed":
        if s.zero_stage not in (1, 2, 3):
            raise ConfigError(f"strategy.zero_stage={s.zero_stage} must be 1, 2 or 3 for strategy={s.name}")
        if s.offload_params and s.zero_stage != 3:
            raise ConfigError(f"strategy.offload_params=true needs ZeRO stage 3, not {s.zero_stage}: use "
                              "strategy=zero3_offload, or drop strategy.offload_params")
        if cfg.precision.name == "fp16" and not has_gpus(cfg):
            raise ConfigError(f"precision=fp16 with strategy={s.name} needs GPUs (DeepSpeed's CPU accelerator has "
                              "no fp16 here): use precision=bf16 or precision=fp32")
    optim_refusal = strategy_refusal(cfg.optim.name, s)
    if optim_refusal:
        raise ConfigError(optim_refusal)
    compile_reason = compile_refusal(cfg, ranks_on_gpus(cfg)) if s.compile or s.cuda_graphs or s.compile_unit != "blocks" else None
    if compile_reason:
        raise ConfigError(compile_reason)
    if s.name == "hsdp" and s.replicate_degree and world % s.replicate_degree:
        raise ConfigError(f"strategy.replicate_degree={s.replicate_degree} does not divide the world size "
                          f"{world}: pick a divisor of {world}")


def _resolve_accumulation(cfg: DictConfig, world: int) -> int:
    """`world`: the data-parallel size (the world size over tensor x pipeline parallel degrees). Unset, a pipeline
    gets 4 micro batches per stage, anything else 1."""
    t = cfg.trainer
    per_step = t.micro_batch_size * world
    if t.global_batch_size is None:
        return int(t.grad_accum_steps or (MIN_MICRO_PER_STAGE * cfg.parallel.pp if cfg.parallel.pp > 1 else 1))
    if t.global_batch_size % per_step:
        raise ConfigError(
            f"trainer.global_batch_size={t.global_batch_size} is not divisible by trainer.micro_batch_size x "
            f"world size = {t.micro_batch_size} x {world}: pick a global batch that is a multiple of {per_step}"
        )
    accum = t.global_batch_size // per_step
    if t.grad_accum_steps is not None and t.grad_accum_steps != accum:
        raise ConfigError(
            f"trainer.grad_accum_steps={t.grad_accum_steps} disagrees with trainer.global_batch_size="
            f"{t.global_batch_size} (micro {t.micro_batch_size} x world {world} needs {accum}): drop one of them"
        )
    return accum


def _check_ranges(cfg: DictConfig, world: int) -> None:
    if world < 1:
        raise ConfigError(f"world size {world} must be at least 1: set local.nproc>=1")
    if cfg.strategy.name == "single" and world > 1:
        raise ConfigError(f"strategy=single runs one process but the world size is {world}: use strategy=ddp")
