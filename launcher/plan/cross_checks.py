"""The plan's cross-field checks that need no world layout: the model's shape (ours counted, a Hugging Face
config applied), the strategy against what is installed and the world, the batch against the world
(the accumulation it implies), the world size itself.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contract.errors import ConfigError
from contract.rules import grad_compression
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
    (a dry run for an H100 cluster plans anywhere), else this machine's (contract/rules/float8.py). And
    trainer.loss_impl=fused's model and layout (contract/rules/loss_chunks.py)."""
    from contract.rules import float8
    from contract.rules.loss_chunks import fused_refusal

    loss_refusal = fused_refusal(cfg)
    if loss_refusal:
        raise ConfigError(loss_refusal)
    if not float8.enabled(cfg.precision):
        return
    # The GPU first: where float8 can't run at all, no change to the model or its layers is the fix.
    if cfg.cluster is not None:
        refusal = float8.gpu_refusal(cfg.cluster.get("gpu_type"), None, f"cluster {cfg.cluster.name}")
    else:
        from launcher.plan.world import local_gpu_capability

        refusal = float8.gpu_refusal(None, local_gpu_capability(), "this machine")
    refusal = refusal or float8.config_refusal(cfg)
    if refusal:
        raise ConfigError(refusal)


# The ZeRO stage each DeepSpeed strategy is: strategy.zero_stage may only repeat it.
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3, "zero3_offload": 3}


def _check_strategy(cfg: DictConfig, world: int) -> None:
    from contract.rules.optimizers import strategy_refusal
    from contract.rules.strategy_names import REGISTRY

    s = cfg.strategy
    if s.name not in REGISTRY:
        raise ConfigError(f"strategy.name={s.name} is unknown: choose one of {', '.join(REGISTRY)}")
    stage = ZERO_STAGES.get(s.name)
    if stage is not None and s.zero_stage != stage:  # strategy=zero3 strategy.zero_stage=1 trained neither
        meant = f"strategy=zero{s.zero_stage}" if s.zero_stage else "strategy=ddp (stage 0 is no ZeRO)"
        raise ConfigError(f"strategy.zero_stage={s.zero_stage} contradicts strategy={s.name} (ZeRO stage {stage}): "
                          f"choose {meant} and drop strategy.zero_stage")
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
    compression_reason = grad_compression.refusal(s)
    if compression_reason:
        raise ConfigError(compression_reason)
    if s.name == "hsdp" and s.replicate_degree and world % s.replicate_degree:
        raise ConfigError(f"strategy.replicate_degree={s.replicate_degree} does not divide the world size "
                          f"{world}: pick a divisor of {world}")


def fitting_micro_batch(global_batch: int, dp: int, micro: int) -> int | None:
    """The largest micro batch, at most `micro`, that divides `global_batch` over `dp` data-parallel ranks (the
    accumulation is re-derived); None when the global batch does not divide over them at all."""
    if global_batch % dp:
        return None
    return next(m for m in range(min(micro, global_batch // dp), 0, -1) if global_batch % (m * dp) == 0)


def resumed_batch(cfg: DictConfig) -> int | None:
    """The global batch of the run this launch resumes (its directory holds one), which it can't change; None for a
    new run."""
    if not cfg.run.name or not cfg.run.resume or cfg.run.overwrite:  # a derived name: the batch is part of it
        return None
    saved = Path(cfg.run.root).expanduser().resolve() / str(cfg.run.name) / "config.yaml"
    try:
        kept = OmegaConf.select(OmegaConf.load(saved), "trainer.global_batch_size") if saved.is_file() else None
    except Exception:  # noqa: BLE001 - a damaged config.yaml is the resume check's to report
        return None
    return int(kept) if isinstance(kept, int) else None


def batch_fix(cfg: DictConfig, dp: int) -> str:
    """What makes the global batch divide over `dp` ranks: the micro batch that does, first, else the global batches
    that do. A resume keeps its saved global batch: then only the micro batch (or the world size) may change."""
    t = cfg.trainer
    saved = resumed_batch(cfg)
    kept, micro = saved or int(t.global_batch_size), int(t.micro_batch_size)
    fitting = fitting_micro_batch(kept, dp, micro)
    resumed = f"; the run being resumed keeps trainer.global_batch_size={kept}" if saved else ""
    if fitting is None:
        sizes = [str(n) for n in range(1, kept + 1) if kept % n == 0][:8]
        ranks = f"run on {', '.join(sizes[:-1])} or {sizes[-1]} data-parallel ranks" if len(sizes) > 1 else \
            "run on 1 data-parallel rank"
        return ranks + resumed if saved else f"pick a global batch that is a multiple of {micro * dp}, or {ranks}"
    accum = kept // (fitting * dp)
    keep = (f"set trainer.micro_batch_size={fitting} ({kept} = {fitting} x {dp} data-parallel rank(s) x {accum} "
            "accumulation step(s))")
    if saved:
        return f"{keep}{resumed}" if saved == int(t.global_batch_size) else \
            f"{keep} and trainer.global_batch_size={kept}{resumed}"
    return f"{keep}, or pick a global batch that is a multiple of {micro * dp}"


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
            f"data-parallel ranks = {t.micro_batch_size} x {world}: {batch_fix(cfg, world)}"
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
