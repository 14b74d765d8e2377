"""Cross-field checks and derived values: world size, accumulation, run name; the plan printed before a run.

Everything here is pure config arithmetic, so it runs on a login node without torch. The world size is
launcher/plan/world.py's, the run name launcher/plan/run_name.py's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from contract.errors import ConfigError
from contract.rules.eval_jobs import check_eval_jobs
from contract.rules.eval_sets import check_eval
from contract.rules.eval_sets import plan_line as eval_plan_line
from contract.rules.grad_compression import plan_lines as compression_lines
from contract.rules.hf_export import export_warning
from contract.rules.keep_best import check_keep_best
from contract.rules.optimizers import check_optim, plan_line
from contract.rules.stability_checks import check_stability
from launcher.checks.cluster_checks import validate_cluster
from launcher.checks.containers import settle as settle_container
from launcher.checks.group_names import settle_names
from launcher.checks.input_checks import check_inputs
from launcher.checks.key_checks import check_keys
from launcher.checks.unread_keys import check_unread_keys
from launcher.plan.cross_checks import (
    _check_model,
    _check_precision,
    _check_ranges,
    _check_strategy,
    _resolve_accumulation,
    count_parameters,
)
from launcher.plan.data_plan import data_lines, eval_set_warnings
from launcher.plan.estimate import GB, ModelShape
from launcher.plan.fit import Budget, Fit, budget, check_fit, scaled_lr
from launcher.plan.init_from import normalize as normalize_init_from
from launcher.plan.init_from import weights_lines
from launcher.plan.init_shape import settle_shape
from launcher.plan.lr_schedule import schedule_note
from launcher.plan.moe_plan import active_params, check_moe, moe_line
from launcher.plan.parallel import (
    check_composable,
    check_layout,
    check_micro_batches,
    model_parallel_shape,
    not_built,
    summary_lines,
)
from launcher.plan.paths import make_absolute, run_name
from launcher.plan.probe import needs_probe, probe
from launcher.plan.replica_plan import check_replica_groups, replica_lines
from launcher.plan.run_length import settle_length
from launcher.plan.step_plan import step_lines
from launcher.plan.world import local_gpu_count, tasks_per_node, world_size


@dataclass(frozen=True)
class Plan:
    mode: str  # local | slurm | prepare
    world_size: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    seq_len: int
    n_params: int
    run_dir: Path
    # SLURM only: what the allocation reserves, the upper bound of one attempt's bill.
    gpus: int = 0
    time_limit_h: float = 0.0
    price_per_gpu_hour: float | None = None
    # The launch plan (launcher/plan/fit.py): memory against capacity, strategy choice, learning rate, compute budget.
    strategy: str = ""
    fit: Fit | None = None
    lr: float = 0.0
    lr_note: str = ""
    budget: Budget | None = None
    # Why the plan has no memory estimate (a user's model that can't be built on the meta device).
    model_note: str = ""
    # The world size over the tensor and pipeline parallel degrees, and how the ranks land on nodes.
    data_parallel: int = 0
    layout_lines: tuple[str, ...] = ()
    # A dry run's plan of a config that would be refused: the one-line reason, printed after the plan (exit 2).
    refusal: str = ""
    # data=tokens: how much of each source the run reads (data_lines), and a warning line per source it repeats.
    data_lines: tuple[str, ...] = ()
    # Which weights the run starts from (launcher/plan/init_from.py), and a warning where that may surprise.
    weights_lines: tuple[str, ...] = ()
    # The steps a trainer.max_tokens or trainer.max_epochs budget converts to (launcher/plan/run_length.py).
    max_steps: int = 0
    length_line: str = ""
    # The optimizer, what weight decay skips and its state per parameter (contract/rules/optimizers.py).
    optim_line: str = ""
    # How a step computes where that is not the obvious: precision=fp8 (contract/rules/float8.py), a chunked loss
    # (contract/rules/loss_chunks.py).
    step_lines: tuple[str, ...] = ()
    # A mixture of experts: its experts, routing, total and active parameters (launcher/plan/moe_plan.py).
    moe_line: str = ""
    active_params: int = 0
    # container=...: the image, the slurmtrain it runs, where that was checked, the mounts (launcher/checks/containers.py)
    container_lines: tuple[str, ...] = ()
    # What the ranks run on: "GPU" or "CPU" (a CPU cluster, or a local run without GPUs); status and the report
    # name the time they count after it.
    accelerator: str = "GPU"

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.time_limit_h

    def cost_line(self) -> str:
        if not self.gpus:
            return ""
        line = (f"; reserves {self.gpus} GPUs for up to {self.time_limit_h:g} h = {self.gpu_hours:,.0f} GPU-hours "
                "per attempt")
        if self.price_per_gpu_hour:
            line += f" (about ${self.gpu_hours * self.price_per_gpu_hour:,.0f} at ${self.price_per_gpu_hour:g}/GPU-hour)"
        return line

    def _params(self) -> str:
        return f"{self.n_params / 1e6:.1f}M" if self.n_params else "an unknown number of"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def summary(self) -> str:
        lines = [
            f"plan: {self.mode}, world size {self.world_size}, effective batch {self.global_batch_size} "
            f"(micro {self.micro_batch_size} x accumulation {self.grad_accum_steps} x data-parallel "
            f"{self.data_parallel or self.world_size}) = {self.tokens_per_step} tokens/step, model {self._params()} "
            f"parameters, run directory {self.run_dir}{self.cost_line()}"
        ]
        lines += [f"  {line}" for line in self.layout_lines]
        if self.moe_line:
            lines.append(f"  {self.moe_line}")
        if self.model_note:
            lines.append(f"  {self.model_note}")
        if self.fit is not None:
            reasons = "; ".join(self.fit.strategy_reasons)
            lines.append(f"  strategy {self.strategy}" + (f" (auto: {reasons})" if reasons else ""))
            lines.append(f"  {self.fit.line()}")
        if self.length_line:
            lines.append(f"  {self.length_line}")
        lines += [f"  {line}" for line in self.step_lines]
        if self.optim_line:
            lines.append(f"  {self.optim_line}")
        if self.lr:
            lines.append(f"  learning rate {self.lr:.4g}{self.lr_note}")
        if self.budget is not None:
            lines.append(f"  {self.budget.line()}")
        lines += [f"  {line}" for line in self.data_lines]
        lines += [f"  {line}" for line in self.weights_lines + self.container_lines]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """RUN_DIR/plan.json: what the launcher decided and estimated, for scripts and for later comparison."""
        out: dict[str, Any] = {
            "mode": self.mode, "world_size": self.world_size, "micro_batch_size": self.micro_batch_size,
            "grad_accum_steps": self.grad_accum_steps, "global_batch_size": self.global_batch_size,
            "tokens_per_step": self.tokens_per_step, "n_params": self.n_params, "strategy": self.strategy,
            "lr": self.lr, "gpus": self.gpus, "gpu_hours_reserved_per_attempt": self.gpu_hours,
            "max_steps": self.max_steps, "accelerator": self.accelerator,
        }
        if self.moe_line:
            out["active_params"] = self.active_params
        if self.length_line:
            out["length"] = self.length_line.removeprefix("length: ")
        if self.fit is not None:
            out["memory_gb"] = self.fit.estimate.as_gb()
            out["capacity_gb"] = None if self.fit.capacity.bytes is None else round(self.fit.capacity.bytes / GB, 3)
            out["capacity"] = self.fit.capacity.what
            out["fits"] = self.fit.fits
            out["strategy_reasons"] = self.fit.strategy_reasons
        if self.budget is not None:
            out["budget"] = asdict(self.budget)
        if self.step_lines:
            out["step"] = list(self.step_lines)
        if self.data_lines:
            out["data"] = list(self.data_lines)
        if self.weights_lines:
            out["weights"] = self.weights_lines[0].removeprefix("weights: ")
        if self.container_lines:
            out["container"] = [line.strip() for line in self.container_lines]
        return out


def model_shape(cfg: DictConfig, world: int) -> tuple[ModelShape | None, str]:
    """Ours from the config; a user's from the model itself (launcher/plan/probe.py, which also checks that a
    data._target_ imports and that the strategy can train the model on `world` ranks). The note says why there
    is no shape, or how it was had."""
    answer = probe(cfg, world) if needs_probe(cfg) else None
    if answer is None or not cfg.model.get("_target_"):
        return ModelShape.ours(cfg.model, count_parameters(cfg.model)), ""
    if answer.shape is None:
        return None, answer.note
    if cfg.model.config_path:  # a Hugging Face model: its vocabulary sizes the logits
        return replace(answer.shape, vocab_size=int(cfg.model.vocab_size)), answer.note
    return answer.shape, answer.note


def make_plan(cfg: DictConfig) -> Plan:
    """Validate cfg and fill in the derived values in place (world size, accumulation, run name)."""
    check_keys(cfg)
    check_unread_keys(cfg)
    settle_names(cfg)
    typed_paths = make_absolute(cfg)  # before anything reads a path, and before the run name hashes them
    if cfg.cluster is not None:
        validate_cluster(cfg)
    world = world_size(cfg)
    _check_ranges(cfg, world)
    normalize_init_from(cfg)  # before the probe and the run name, which read it
    shape_lines = settle_shape(cfg)  # model.init_from's shape, before anything reads the model's keys
    _check_model(cfg)
    _check_precision(cfg)
    check_moe(cfg, world)
    check_inputs(cfg)
    check_eval(cfg)
    check_keep_best(cfg)
    check_stability(cfg)
    check_optim(cfg.optim)
    if cfg.strategy.name != "auto":
        _check_strategy(cfg, world)
    shape, shape_note = model_shape(cfg, world)
    nodes = int(cfg.cluster.nodes) if cfg.cluster is not None else 1
    local_gpus = local_gpu_count() if cfg.cluster is None else 0
    if cfg.cluster is None and cfg.local.backend == "nccl" and not local_gpus:
        raise ConfigError("local.backend=nccl needs GPUs and this machine has none: drop local.backend (gloo is "
                          "picked on CPUs)")
    degrees = check_layout(cfg, world, tasks_per_node(cfg.cluster) if cfg.cluster is not None else world)
    dp = degrees.dp
    check_replica_groups(cfg, dp)  # parallel.replica_groups: before anything starts
    # A dry run shows the plan even of a config it refuses (then the refusal, exit 2); anything else refuses now.
    refusal = _deferred(cfg, check_composable, cfg, degrees)
    fit = None
    if shape is not None:
        # The states shard over the data-parallel ranks, and over the context-parallel ones with them (parallel.cp).
        fit_args = (cfg, dp * degrees.cp, nodes, model_parallel_shape(shape, degrees), local_gpus)
        try:
            fit = check_fit(*fit_args, refuse=not cfg.launcher.prepare_only, ranks=world)
        except ConfigError as err:
            if not cfg.launcher.dry_run or cfg.strategy.name == "auto":
                raise
            refusal = refusal or str(err)
            fit = check_fit(*fit_args, refuse=False, ranks=world)
    elif cfg.strategy.name == "auto":
        raise ConfigError(f"strategy=auto needs a memory estimate, and there is none ({shape_note}): name the "
                          "strategy, for example strategy=fsdp")
    _check_strategy(cfg, dp)
    accum = _resolve_accumulation(cfg, dp)
    check_micro_batches(degrees, accum)
    global_batch = cfg.trainer.micro_batch_size * accum * dp
    # Before anything reads trainer.max_steps (evaluation jobs, the schedule, the budget): a token or epoch budget
    # becomes it here.
    length = settle_length(cfg, global_batch, int(cfg.data.seq_len), world)
    check_eval_jobs(cfg, global_batch, tasks_per_node(cfg.cluster) if cfg.cluster is not None else 1)
    unbuilt = not_built(cfg, degrees)
    if unbuilt and not cfg.launcher.dry_run:
        raise ConfigError(unbuilt)
    lr = scaled_lr(cfg, global_batch)
    with open_dict(cfg):
        cfg.trainer.grad_accum_steps = accum
        cfg.trainer.global_batch_size = global_batch
        cfg.optim.scaled_lr = lr
        if cfg.cluster is None:
            cfg.local.nproc = world
        if not cfg.run.name:
            cfg.run.name = run_name(cfg, typed_paths)
    if "/" in cfg.run.name or cfg.run.name in (".", ".."):
        raise ConfigError(f"run.name={cfg.run.name!r} must be a plain directory name: drop the slashes")
    # Read once: data.seq_len interpolates model.max_seq_len, which OmegaConf parses again at every read.
    run_dir, seq_len = _run_dir(cfg), int(cfg.data.seq_len)
    container_lines = settle_container(cfg, run_dir.parent)  # before config.yaml: it settles container.code
    return Plan(
        mode="prepare" if cfg.launcher.prepare_only else "local" if cfg.cluster is None else "slurm",
        world_size=world,
        micro_batch_size=cfg.trainer.micro_batch_size,
        grad_accum_steps=accum,
        global_batch_size=cfg.trainer.global_batch_size,
        seq_len=seq_len,
        n_params=shape.n_params if shape is not None else 0,
        run_dir=run_dir,
        strategy=cfg.strategy.name,
        fit=fit,
        lr=lr,
        lr_note=_lr_note(cfg, global_batch, lr, run_dir),
        budget=None if shape is None else budget(
            cfg, world, global_batch * seq_len,
            int(cfg.cluster.nodes) * int(cfg.cluster.gpus_per_node) if cfg.cluster is not None else local_gpus, shape),
        model_note=shape_note,
        refusal=refusal,
        data_parallel=dp,
        layout_lines=tuple(summary_lines(degrees, world, accum)) + replica_lines(cfg, dp, world, global_batch),
        data_lines=data_lines(cfg, int(cfg.trainer.max_steps) * global_batch) + tuple(
            line for line in [eval_plan_line(cfg, global_batch)] if line) + eval_set_warnings(cfg, global_batch),
        weights_lines=weights_lines(cfg, run_dir, world) + shape_lines + tuple(
            line for line in [export_warning(cfg.model)] if line),
        max_steps=length.steps,
        optim_line=plan_line(cfg.optim, None if shape is None else shape.optimizer_bytes_per_param(cfg.optim)),
        length_line=length.line,
        step_lines=(*step_lines(cfg, shape, seq_len, fit.estimate.states if fit else None),
                    *compression_lines(cfg, dp, nodes)),
        moe_line=moe_line(cfg, shape.n_params) if shape is not None else "",
        active_params=active_params(cfg, shape.n_params) if shape is not None else 0,
        container_lines=container_lines,
        accelerator="GPU" if (cfg.cluster.gpus_per_node if cfg.cluster is not None else local_gpus) else "CPU",
        **_reservation(cfg),
    )


def _deferred(cfg: DictConfig, check: Any, *args: Any, **kwargs: Any) -> str:
    """Run a check; in a dry run return its refusal (shown after the plan) instead of raising it."""
    try:
        check(*args, **kwargs)
    except ConfigError as err:
        if not cfg.launcher.dry_run or cfg.strategy.name == "auto":
            raise
        return str(err)
    return ""


def _run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.run.root).expanduser().resolve() / cfg.run.name


def _lr_note(cfg: DictConfig, global_batch: int, lr: float, run_dir: Path) -> str:
    """Where the peak rate comes from, the schedule, and what the rate does across a resume (launcher/plan/lr_schedule.py,
    which refuses a schedule that can't run)."""
    o = cfg.optim
    if o.lr_scaling == "none":
        source = " (optim.lr, no scaling)"
    else:
        source = (f" (optim.lr={o.lr:g} x {o.lr_scaling} scaling for global batch {global_batch} against "
                  f"optim.reference_batch_size={o.reference_batch_size})")
    return source + schedule_note(cfg, lr, run_dir)


def _reservation(cfg: DictConfig) -> dict[str, Any]:
    c = cfg.cluster
    if c is None or cfg.launcher.prepare_only:
        return {}
    return {"gpus": int(c.nodes) * int(c.gpus_per_node), "time_limit_h": c.time_limit_min / 60,
            "price_per_gpu_hour": c.price_per_gpu_hour}
