"""Does the job fit, which strategy should it use, what will it cost: the launch plan's judgement.

Before anything is written or submitted: the memory estimate (launcher/plan/estimate.py) against the GPU's memory (cluster
config), or a local run's share of this host's memory (or its GPUs'); `strategy=auto` picks the first layout that
fits; a job that does not fit is refused with the cheapest change that does.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contract.config.schema import StrategyConfig
from contract.errors import ConfigError
from contract.rules import float8, grad_compression
from contract.rules.compile_modes import compile_refusal
from contract.rules.optimizers import strategy_refusal
from launcher.plan.estimate import GB, MemoryEstimate, ModelShape, estimate_memory
from launcher.plan.fit_advice import smaller_run
from launcher.plan.parallel import COMPOSABLE

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# strategy=auto tries these in order (cheapest communication first); activation checkpointing, then offload last.
AUTO_MULTI = ("ddp", "zero1", "fsdp_grad_op", "zero2", "fsdp", "zero3", "fsdp+ac", "zero3+ac", "zero3_offload",
              "zero3_offload+ac")
# One GPU is never distributed by default.
AUTO_SINGLE = ("single", "single+ac", "zero3_offload", "zero3_offload+ac")


@dataclass
class Capacity:
    bytes: float | None  # per rank; None: unknown, nothing is refused
    what: str
    # Host memory per rank for what offloading keeps there (None: unknown, not checked).
    host_bytes: float | None = None
    # The ranks compute in host memory (a CPU run): what offloading moves "to the host" stays in `bytes`.
    shared_host: bool = False


@dataclass
class Fit:
    estimate: MemoryEstimate
    capacity: Capacity
    strategy_reasons: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return fits(self.estimate, self.capacity)

    def line(self) -> str:
        cap = self.capacity
        if cap.bytes is None:
            return f"memory per rank: {self.estimate.breakdown()} ({cap.what})"
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return f"memory per rank: {self.estimate.breakdown()} of {gb(cap.bytes)} GB ({cap.what}): {verdict}"


def gb(n: float) -> str:
    """Bytes in GB, to a tenth; a figure under 0.1 GB to two significant digits (not '0.0 GB')."""
    value = n / GB
    return f"{value:.2g}" if 0 < value < 0.1 else f"{value:.1f}"


def fits(est: MemoryEstimate, cap: Capacity) -> bool:
    device_ok = cap.bytes is None or _on_device(est, cap) <= cap.bytes
    return device_ok and (cap.host_bytes is None or est.host <= cap.host_bytes)


def _on_device(est: MemoryEstimate, cap: Capacity) -> float:
    return est.total + est.host if cap.shared_host else est.total


def shortfall(est: MemoryEstimate, cap: Capacity) -> str:
    if cap.bytes is not None and _on_device(est, cap) > cap.bytes:
        if cap.shared_host and est.host:
            return (f"{gb(_on_device(est, cap))} GB per rank (with what offloading keeps in the same host "
                    f"memory) > {gb(cap.bytes)} GB")
        return f"{gb(est.total)} GB per rank > {gb(cap.bytes)} GB"
    return f"{gb(est.host)} GB of host memory per rank > {gb(cap.host_bytes or 0)} GB"


def host_available_bytes() -> float:
    import psutil

    return float(psutil.virtual_memory().available)


def local_gpu_memory_bytes() -> float | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=False)
        return float(out.stdout.split()[0]) * 1024**2
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def capacity(cfg: DictConfig, world: int, local_gpus: int) -> Capacity:
    c = cfg.cluster
    if c is not None:
        if c.gpus_per_node and c.gpu_memory_gb:
            host = c.mem_per_task_gb * GB if c.mem_per_task_gb else None
            return Capacity(c.gpu_memory_gb * GB, f"{c.gpu_type or 'GPU'} memory, cluster {c.name}", host)
        if c.mem_per_task_gb:
            return Capacity(c.mem_per_task_gb * GB, f"cluster.mem_per_task_gb of {c.name}", shared_host=True)
        return Capacity(None, f"cluster {c.name} declares no GPU memory or mem_per_task_gb: not checked")
    if local_gpus:
        mem = local_gpu_memory_bytes()
        host = host_available_bytes() / max(1, world)
        return Capacity(mem, "this machine's GPU memory", host) if mem else Capacity(None, "GPU memory unknown")
    ranks = max(1, world)
    return Capacity(host_available_bytes() / ranks, f"this host's available memory / {ranks} local rank(s)",
                    shared_host=True)


def strategy_node(name: str, base: Any) -> Any:
    """The strategy config for `name` (`fsdp+ac`: with activation checkpointing), keeping the user's other knobs."""
    strategy, _, ac = name.partition("+")
    node: Any = OmegaConf.merge(OmegaConf.structured(StrategyConfig),
                                OmegaConf.load(CONF_DIR / "strategy" / f"{strategy}.yaml"))
    for key in ("bucket_cap_mb", "gradient_as_bucket_view", "compile", "compile_unit", "cuda_graphs",
                "grad_compression", "powersgd_rank"):
        node[key] = base[key]
    node.activation_checkpointing = bool(ac) or bool(base.activation_checkpointing)
    return node


def unavailable(name: str, cfg: DictConfig, has_gpus: bool) -> str | None:
    if strategy_refusal(cfg.optim.name, strategy_node(name, cfg.strategy)):
        return f"can't step optim={cfg.optim.name}"
    compression = grad_compression.refusal(strategy_node(name, cfg.strategy))
    if compression:
        return compression.split(":")[0]
    if cfg.strategy.compile_unit == "model" or cfg.strategy.cuda_graphs:
        reason = compile_refusal(with_strategy(cfg, name), has_gpus)
        if reason:
            return reason.split(":")[0]
    if name.startswith("zero"):
        if float8.enabled(cfg.precision):
            return "DeepSpeed does not run precision=fp8"
        if importlib.util.find_spec("deepspeed") is None:
            return "deepspeed is not installed"
        if cfg.precision.name == "fp16" and not has_gpus:
            return "DeepSpeed fp16 needs GPUs"
    return None


def with_strategy(cfg: DictConfig, name: str) -> DictConfig:
    trial = cfg.copy()
    trial.strategy = strategy_node(name, cfg.strategy)
    return trial


def estimate_for(cfg: DictConfig, world: int, nodes: int, shape: ModelShape) -> MemoryEstimate:
    margin = cfg.launcher.memory_margin_gb * GB
    return estimate_memory(cfg, world, nodes, shape, margin, cfg.launcher.memory_fragmentation)


@dataclass(frozen=True)
class Option:
    strategy: str  # a name from AUTO_* (`fsdp+ac`: with activation checkpointing)
    micro_batch_size: int
    nodes: int
    estimate: MemoryEstimate

    def overrides(self, cfg: DictConfig) -> str:
        strategy, _, ac = self.strategy.partition("+")
        parts = [] if strategy == cfg.strategy.name else [f"strategy={strategy}"]
        if ac and not cfg.strategy.activation_checkpointing:
            parts.append("strategy.activation_checkpointing=true")
        if self.micro_batch_size != cfg.trainer.micro_batch_size:
            parts.append(f"trainer.micro_batch_size={self.micro_batch_size}")
        if cfg.cluster is not None and self.nodes != cfg.cluster.nodes:
            parts.append(f"cluster.nodes={self.nodes}")
        return " ".join(parts)


def candidates(cfg: DictConfig, world: int, has_gpus: bool) -> tuple[list[str], list[str]]:
    """Strategy names to try, in strategy=auto's order, and why the others cannot be used here."""
    names, skipped = [], []
    model_parallel = int(cfg.parallel.tp) * int(cfg.parallel.pp) * int(cfg.parallel.get("cp", 1)) > 1
    expert_parallel = int(cfg.parallel.get("ep", 1)) > 1  # DeepSpeed's strategies are refused with it too
    for name in AUTO_SINGLE if world == 1 and not model_parallel else AUTO_MULTI:
        why_not = unavailable(name, cfg, has_gpus)
        if model_parallel and name.split("+")[0] not in COMPOSABLE:
            why_not = "does not compose with parallel.tp/pp/cp"
        elif expert_parallel and name.split("+")[0] not in COMPOSABLE:
            why_not = "parallel.ep needs a torch strategy"
        if why_not:
            skipped.append(f"{name}: {why_not}")
        elif not (cfg.strategy.activation_checkpointing and not name.endswith("+ac")):
            names.append(name)
    return names, skipped


def search(cfg: DictConfig, world: int, nodes: int, shape: ModelShape, cap: Capacity, has_gpus: bool,
           node_steps: tuple[int, ...] = (1,)) -> tuple[Option | None, list[str]]:
    """The first option that fits, cheapest first: the configured nodes before more nodes; offloading last, after
    every other strategy at every micro batch (it moves the states over PCIe every step, which costs more than the
    accumulation steps a smaller micro batch adds); the configured micro batch before smaller ones; strategies in
    strategy=auto's order. Also says why the configured micro batch fits with none of the strategies before the
    one found."""
    names, reasons = candidates(cfg, world, has_gpus)
    per_node = max(1, world // max(1, nodes))
    groups = [[n for n in names if "offload" not in n], [n for n in names if "offload" in n]]
    for more in node_steps:
        for group in groups:
            micro = cfg.trainer.micro_batch_size
            while micro >= 1:
                for name in group:
                    trial = with_strategy(cfg, name)
                    trial.trainer.micro_batch_size = micro
                    est = estimate_for(trial, per_node * nodes * more, nodes * more, shape)
                    if fits(est, cap):
                        return Option(name, micro, nodes * more, est), reasons
                    if more == node_steps[0] and micro == cfg.trainer.micro_batch_size:
                        reasons.append(f"{name}: {shortfall(est, cap)}")
                micro //= 2
    return None, reasons


def _keep_effective_batch(cfg: DictConfig, option: Option, world: int) -> str:
    """A smaller micro batch chosen by strategy=auto keeps the effective batch: more accumulation steps."""
    micro = cfg.trainer.micro_batch_size
    if option.micro_batch_size == micro:
        return ""
    if cfg.trainer.global_batch_size is None:
        cfg.trainer.global_batch_size = micro * int(cfg.trainer.grad_accum_steps or 1) * world
        cfg.trainer.grad_accum_steps = None
    return f" with trainer.micro_batch_size={option.micro_batch_size} (same effective batch, more accumulation)"


def _more_nodes_advice(cfg: DictConfig, world: int, nodes: int, shape: ModelShape, cap: Capacity, has_gpus: bool,
                       ranks: int, local_gpus: int) -> str:
    if cfg.cluster is not None:
        option, _ = search(cfg, world, nodes, shape, cap, has_gpus, node_steps=(2, 4, 8, 16, 32))
        if option is not None:
            return f"use {option.overrides(cfg)} ({gb(_on_device(option.estimate, cap))} GB per rank)"

    def fits_at(trial: DictConfig, trial_shape: ModelShape, n: int) -> bool:
        trial_cap = cap if n == ranks else capacity(trial, n, local_gpus)
        return fits(estimate_for(trial, max(1, world * n // ranks), nodes, trial_shape), trial_cap)

    return smaller_run(cfg, shape, ranks, fits_at) or "nothing fits on this hardware: use a smaller model or more, " \
        "larger GPUs"


def check_fit(cfg: DictConfig, world: int, nodes: int, shape: ModelShape, local_gpus: int, refuse: bool = True,
              ranks: int | None = None) -> Fit:
    """`world`: the data-parallel size the states are sharded over; `ranks`: the processes sharing this host's
    memory (the world size; more than `world` with tensor or pipeline parallelism)."""
    has_gpus = bool(local_gpus) if cfg.cluster is None else int(cfg.cluster.gpus_per_node) > 0
    cap = capacity(cfg, ranks or world, local_gpus)
    reasons: list[str] = []
    if cfg.strategy.name == "auto":
        cfg.strategy.name = "ddp" if world > 1 else "single"  # a concrete starting point for the search
        option, reasons = search(cfg, world, nodes, shape, cap, has_gpus)
        if option is None:
            raise ConfigError(f"strategy=auto: no strategy fits model={cfg.model.name} ({reasons[-1]}; {cap.what}): "
                              + _more_nodes_advice(cfg, world, nodes, shape, cap, has_gpus, ranks or world, local_gpus))
        keep = _keep_effective_batch(cfg, option, world)
        cfg.strategy = strategy_node(option.strategy, cfg.strategy)
        cfg.trainer.micro_batch_size = option.micro_batch_size
        reasons.append(f"picked {option.strategy}" + keep + f": {gb(_on_device(option.estimate, cap))} GB per rank")
    fit = Fit(estimate_for(cfg, world, nodes, shape), cap, reasons)
    if not fit.fits and refuse and not cfg.launcher.force:
        option, _ = search(cfg, world, nodes, shape, cap, has_gpus)
        advice = (f"use {option.overrides(cfg)} ({gb(_on_device(option.estimate, cap))} GB per rank)" if option
                  else _more_nodes_advice(cfg, world, nodes, shape, cap, has_gpus, ranks or world,
                                          local_gpus))
        raise ConfigError(
            f"model={cfg.model.name} with strategy={cfg.strategy.name} does not fit: {shortfall(fit.estimate, cap)} "
            f"({cap.what}): {advice}; or add launcher.force=true to run anyway"
        )
    return fit


def scaled_lr(cfg: DictConfig, global_batch: int) -> float:
    o = cfg.optim
    if o.lr_scaling == "none":
        return float(o.lr)
    if not o.reference_batch_size or o.reference_batch_size < 1:
        raise ConfigError(f"optim.lr_scaling={o.lr_scaling} needs the batch size optim.lr was tuned for: add "
                          "optim.reference_batch_size=N")
    ratio = global_batch / o.reference_batch_size
    return float(o.lr * (ratio if o.lr_scaling == "linear" else math.sqrt(ratio)))


@dataclass
class Budget:
    flops_per_token: float
    peak_tflops: float | None
    mfu: float | None
    step_s: float | None
    wall_h: float | None
    gpu_hours: float | None
    cost: float | None
    attempts: int | None

    def line(self) -> str:
        text = f"compute: {self.flops_per_token / 1e9:.3g} GFLOP per token"
        if self.step_s is None:
            return text + " (no peak TFLOP/s known: set telemetry.peak_tflops for a time estimate)"
        text += (f", about {self.step_s:.3g} s per step at {self.mfu:.0%} MFU of {self.peak_tflops:.4g} TFLOP/s, "
                 f"{self.wall_h:.3g} h to the last step")
        if self.gpu_hours is not None:
            text += f", {self.gpu_hours:,.1f} GPU-hours"
        if self.cost is not None:
            text += f" (about ${self.cost:,.0f})"
        if self.attempts is not None:
            text += f", {self.attempts} attempt(s) of the time limit"
        return text


def budget(cfg: DictConfig, world: int, tokens_per_step: int, gpus: int, shape: ModelShape) -> Budget:
    fpt = shape.flops_per_token(cfg.data.seq_len)
    c = cfg.cluster
    peak = (float8.peak_tflops(cfg.precision, dict(c.peak_tflops), shape.config, cfg.data.seq_len)
            if c is not None else cfg.telemetry.peak_tflops)
    mfu = float(c.assumed_mfu) if c is not None else 0.4
    if not peak:
        return Budget(fpt, None, None, None, None, None, None, None)
    step_s = fpt * tokens_per_step / (world * peak * 1e12 * mfu)
    wall_h = step_s * cfg.trainer.max_steps / 3600
    gpu_hours = wall_h * gpus if gpus else None
    price = c.price_per_gpu_hour if c is not None else None
    cost = gpu_hours * price if gpu_hours is not None and price else None
    attempts = None
    if c is not None:
        usable_h = max(1e-9, (c.time_limit_min * 60 - c.signal_lead_s) / 3600)
        attempts = max(1, math.ceil(wall_h / usable_h))
    return Budget(fpt, float(peak), mfu, step_s, wall_h, gpu_hours, cost, attempts)
