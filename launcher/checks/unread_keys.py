"""Keys the chosen options never read: set away from their default, each is refused with the choice that reads it.

A key that nothing reads would be accepted in silence and still change the derived run name
(`model.moe.top_k=3` on a dense model, `precision.float8_recipe=rowwise` under precision=fp32). One table says,
for each such key, which choice reads it; the optimizer's own keys and the schedule's follow the same rule with
their tables (contract/rules/optimizers.py READS, contract/rules/schedules.py READS), and so do the logger's keys
that only wandb reads (contract/rules/log_backends.py), model.args and data.args without a _target_
(launcher/checks/group_names.py) and trainer.epochs_of without trainer.max_epochs (launcher/plan/run_length.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contract.config import schema
from contract.errors import ConfigError
from contract.rules.eval_jobs import jobs_enabled
from contract.rules.eval_sets import validates
from launcher.checks.key_checks import _hints, _sections
from launcher.checks.overrides import as_typed, typed_for


@dataclass(frozen=True)
class Reader:
    keys: tuple[str, ...]  # read only when `reads` holds
    reads: Callable[[Any], bool]  # the config's choices read the keys
    now: Callable[[Any], str]  # the choice in force, in words: "model=tiny, a dense model"
    fix: str  # the choice that reads them: "make the model a mixture of experts (model.moe.num_experts=N)"


def _strategy(*names: str) -> Callable[[Any], bool]:
    # strategy=auto picks its strategy later, from the memory estimate, and keeps these knobs for it
    # (launcher/plan/fit.py strategy_node).
    return lambda c: c.strategy.name in (*names, "auto")


def _picked(c: Any) -> str:
    """A strategy's own settings under strategy=auto: the pick brings its own (strategy_node keeps only the knobs)."""
    if c.strategy.name == "auto":
        return "strategy=auto, which picks the strategy and sets its own"
    return f"strategy={c.strategy.name}"


READERS: tuple[Reader, ...] = (
    Reader(("model.moe.top_k", "model.moe.capacity_factor", "model.moe.shared_experts", "model.moe.aux_loss_coef",
            "model.moe.z_loss_coef", "model.moe.every"),
           lambda c: bool(c.model.moe.num_experts), lambda c: f"model={c.model.name}, a dense model",
           "make it a mixture of experts (model.moe.num_experts=N, or model=moe_tiny)"),
    Reader(("precision.float8_recipe",), lambda c: c.precision.name == "fp8", lambda c: f"precision={c.precision.name}",
           "choose precision=fp8"),
    Reader(("model.rope_theta",), lambda c: c.model.position == "rope",
           lambda c: f"model.position={c.model.position}", "set model.position=rope"),
    Reader(("optim.reference_batch_size",), lambda c: c.optim.lr_scaling != "none",
           lambda c: "optim.lr_scaling=none", "set optim.lr_scaling=linear or sqrt"),
    Reader(("strategy.bucket_cap_mb", "strategy.gradient_as_bucket_view"), _strategy("ddp"),
           lambda c: f"strategy={c.strategy.name}", "choose strategy=ddp"),
    Reader(("strategy.reshard_after_forward",), lambda c: c.strategy.name in ("fsdp", "fsdp_grad_op", "hsdp"),
           _picked, "choose strategy=fsdp, fsdp_grad_op or hsdp"),
    Reader(("strategy.powersgd_rank",), lambda c: c.strategy.get("grad_compression") == "powersgd",
           lambda c: f"strategy.grad_compression={c.strategy.get('grad_compression')}",
           "set strategy.grad_compression=powersgd (strategy=ddp)"),
    Reader(("strategy.replicate_degree",), lambda c: c.strategy.name == "hsdp",
           lambda c: f"strategy={c.strategy.name}", "choose strategy=hsdp"),
    Reader(("strategy.zero_stage", "strategy.offload_optimizer", "strategy.offload_params"),
           lambda c: c.strategy.backend == "deepspeed",
           lambda c: _picked(c) if c.strategy.name == "auto" else f"strategy={c.strategy.name}, not DeepSpeed's",
           "choose a DeepSpeed strategy (strategy=zero1, zero2, zero3 or zero3_offload)"),
    Reader(("parallel.pp_schedule",), lambda c: int(c.parallel.pp) > 1, lambda c: "parallel.pp=1",
           "set parallel.pp=N (pipeline stages)"),
    Reader(("parallel.pp_virtual_stages",), lambda c: c.parallel.pp_schedule == "interleaved_1f1b",
           lambda c: f"parallel.pp_schedule={c.parallel.pp_schedule}", "set parallel.pp_schedule=interleaved_1f1b"),
    Reader(("parallel.allow_cross_node_tp",), lambda c: int(c.parallel.tp) > 1, lambda c: "parallel.tp=1",
           "set parallel.tp=N"),
    Reader(("data.signal",), lambda c: c.data.name == "synthetic", lambda c: f"data={c.data.name}",
           "choose data=synthetic"),
    # The synthetic stream is a function of the sample index: no file order to shuffle, no file dtype.
    Reader(("data.shuffle", "data.dtype"), lambda c: c.data.name != "synthetic" or bool(c.data.get("_target_")),
           lambda c: "data=synthetic", "choose data=tokens (a token file or a prepared corpus)"),
    Reader(("parallel.replica_heartbeat_timeout_ms", "parallel.replica_join_timeout_ms",
            "parallel.replica_quorum_timeout_s", "parallel.replica_timeout_s"),
           lambda c: int(c.parallel.get("replica_groups", 1)) > 1, lambda c: "parallel.replica_groups=1",
           "set parallel.replica_groups=N (docs/faults.md)"),
    Reader(("optim.sync_every", "optim.outer_lr", "optim.outer_momentum", "optim.outer_nesterov"),
           lambda c: c.optim.get("outer", "none") == "diloco", lambda c: f"optim.outer={c.optim.get('outer', 'none')}",
           "set optim.outer=diloco (with parallel.replica_groups=N; docs/faults.md)"),
    # A validation pass's size and sets: read only when something validates (eval.every, evaluation jobs, or
    # eval.at_start=true alone); eval.harness.tasks has its own refusal (contract/rules/harness.py).
    Reader(("eval.batches", "eval.sets"), validates, lambda c: "eval.every=0 (no validation)",
           "set eval.every=N (validate every N steps)"),
    Reader(("eval.job_nodes", "eval.job_tasks_per_node", "eval.job_partition", "eval.job_qos",
            "eval.job_time_limit_min"), jobs_enabled, lambda c: "eval.async_jobs=false",
           "set eval.async_jobs=true (with +cluster=NAME)"),
    # Not telemetry.peak_tflops: the plan's time estimate reads it whatever telemetry.enabled says.
    Reader(("telemetry.straggler_factor", "telemetry.straggler_intervals"), lambda c: bool(c.telemetry.enabled),
           lambda c: "telemetry.enabled=false", "drop telemetry.enabled=false (the straggler rule is telemetry's)"),
)


@functools.cache
def default(key: str) -> Any:
    """The schema's default of a dotted key."""
    cls: Any = schema.Config
    *sections, leaf = key.split(".")
    for part in sections:
        cls = _sections(cls)[part]
    assert leaf in _hints(cls), key
    field = next(f for f in dataclasses.fields(cls) if f.name == leaf)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _first_leaf(key: str, value: dict[str, Any]) -> str:
    """A dict's key as an override sets it (eval.sets.val.kind=synthetic): as typed, else its first leaf."""
    typed = typed_for(key)
    if typed is not None:
        return typed.lstrip("+")
    while isinstance(value, dict) and value:
        name, value = next(iter(value.items()))
        key = f"{key}.{name}"
    return as_typed(key, value)


def check_unread_keys(cfg: DictConfig) -> None:
    """A key set away from its default that the config's choices never read: one line naming what reads it."""
    for reader in READERS:
        if reader.reads(cfg):
            continue
        for key in reader.keys:
            value = _value(cfg, key)
            if value != default(key):
                said = _first_leaf(key, value) if isinstance(value, dict) else as_typed(key, value)
                raise ConfigError(f"{said} has no effect with {reader.now(cfg)} (nothing else reads "
                                  f"it): drop it, or {reader.fix}")
