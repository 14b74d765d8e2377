"""DeepSpeed ZeRO stages 1-3, and ZeRO-3 with CPU offload, behind the Strategy protocol.

The DeepSpeed config is generated from ours (`deepspeed_config`), never written by hand, so batch sizes,
clipping, precision and the ZeRO stage cannot disagree with the trainer. The optimizer and the learning-rate
schedule are ours too: train.optim's optimizer over its parameter groups (optim=adamw, sgd or lion, whose update is
elementwise and so the same on DeepSpeed's flat partitions; DeepSpeedCPUAdam, the same decoupled AdamW update in C++,
when the optimizer state is offloaded: DeepSpeed requires it there; contract/rules/optimizers.py refuses the rest) and train.optim's
LambdaLR on the optimizer DeepSpeed steps. DeepSpeed gets no optimizer or scheduler section.

Precision is DeepSpeed's own: with bf16/fp16 the engine holds the module in that dtype and keeps fp32 master
weights in its optimizer (fp16 with a dynamic loss scale, saved in its checkpoint), so there is no autocast.

Forward only (setup(train=False), an evaluation job): every stage runs as ZeRO-3 without an optimizer (DeepSpeed's
ZeRO-Offload engine, as for inference): the parameters partitioned and cast as training has them, gathered per
module for the forward; ZeRO-1/2 can't build an engine without an optimizer, whose state would double the memory.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from contract.errors import ConfigError
from contract.rules.optimizers import strategy_refusal
from train.model.blocks import prepare_blocks
from train.observe import quiet
from train.optim import build_optimizer, build_scheduler, param_groups, peak_lr
from train.strategies.base import Strategy
from train.strategies.limits import scalar_refusal

# DeepSpeed's ZeRO calls torch collectives under their old names (all_gather_into_tensor,
# reduce_scatter_tensor): a warning per call site on every rank that nobody here can act on.
warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)

# Dynamic fp16 loss scale, as torch's GradScaler does it: start at 2**16, halve on overflow (here after
# `hysteresis` consecutive overflows) and skip that step, double after `loss_scale_window` clean steps.
FP16_LOSS_SCALE = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                   "min_loss_scale": 1}


def deepspeed_config(cfg: Any, world_size: int, pin_memory: bool = False) -> dict[str, Any]:
    """The DeepSpeed JSON config for this run, derived from ours (written beside every checkpoint)."""
    t, s, dtype = cfg.trainer, cfg.strategy, cfg.precision.compute_dtype
    if s.zero_stage not in (1, 2, 3):
        raise ValueError(f"strategy.zero_stage={s.zero_stage} must be 1, 2 or 3 for strategy={s.name}")
    if s.offload_params and s.zero_stage != 3:
        # DeepSpeed would silently keep the parameters on the device.
        raise ValueError(f"strategy.offload_params=true needs ZeRO stage 3, not {s.zero_stage}: "
                         "use strategy=zero3_offload, or drop strategy.offload_params")
    zero: dict[str, Any] = {"stage": int(s.zero_stage)}
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if s.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    # Buckets sized by the model, as HF Transformers' "auto" values are, not DeepSpeed's fixed 5e8 elements
    # (a 2 GB fp32 buffer per rank even for a tiny model, and one bucket for a whole small model).
    d = int(cfg.model.d_model)
    zero["reduce_bucket_size"] = d * d
    if s.zero_stage == 3:
        # Parameters smaller than 10 x d_model (norms) stay whole on every rank; the rest are partitioned.
        zero.update(stage3_param_persistence_threshold=10 * d, stage3_prefetch_bucket_size=int(0.9 * d * d))
    else:
        zero["allgather_bucket_size"] = d * d
    return {
        "train_batch_size": int(t.micro_batch_size * t.grad_accum_steps * world_size),
        "train_micro_batch_size_per_gpu": int(t.micro_batch_size),
        "gradient_accumulation_steps": int(t.grad_accum_steps),
        # 0 disables clipping, as optim.grad_clip=0 does for the torch strategies.
        "gradient_clipping": float(cfg.optim.grad_clip),
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16", **(FP16_LOSS_SCALE if dtype == "float16" else {})},
        "wall_clock_breakdown": False,
        # optim=sgd or lion: ZeRO steps them as it steps AdamW (elementwise updates on its partitions), though it
        # lists only its own optimizers as tested (contract/rules/optimizers.py refuses the others).
        **({"zero_allow_untested_optimizer": True} if cfg.optim.get("name", "adamw") != "adamw" else {}),
    }


def import_deepspeed(strategy_name: str, device: torch.device) -> Any:
    """Import deepspeed for this device; a missing package is an error that names the fix."""
    if device.type == "cpu":
        # DeepSpeed picks its accelerator once, at first use: CPU ranks must not grab a GPU that happens to exist.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as err:
        if err.name != "deepspeed":
            raise
        raise ImportError(f"strategy={strategy_name} needs deepspeed: run pip install -e .[deepspeed]") from err
    return deepspeed


def ensure_process_group() -> None:
    """DeepSpeed needs a process group even for one rank; a single process has none (entry.py skips it)."""
    if not dist.is_initialized():
        # A 1-rank gloo group on an in-memory store: no port to pick, nothing to collide with.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class DeepSpeedStrategy(Strategy):
    """The DeepSpeed engine owns the model, gradient reduction, clipping, precision and the optimizer step."""

    checkpoint_format = "deepspeed"

    def __init__(self, cfg: Any, env: Any, device: torch.device) -> None:
        super().__init__(cfg, env, device)
        self.ds_config = deepspeed_config(cfg, env.world_size, pin_memory=device.type == "cuda")
        self.engine: Any = None
        self.basic_optimizer: torch.optim.Optimizer | None = None
        self._last_micro_step = True

    # -- set-up --------------------------------------------------------------------------------------------
    @classmethod
    def refusal(cls, name: str, model: nn.Module, blocks: list[tuple[str, nn.Module]],
                unused: list[str] | None) -> str | None:
        # The engine broadcasts each parameter viewed as bytes at start-up, which a 0-dim tensor can't be.
        return scalar_refusal(name, model, "strategy=fsdp or strategy=ddp")

    def setup(self, model: nn.Module, train: bool = True) -> nn.Module:
        self.trains = train
        self.check_model(model)
        deepspeed = import_deepspeed(self.name, self.device)
        self._check_precision()
        ensure_process_group()
        # DeepSpeed takes its device from $LOCAL_RANK and asserts it is set, but srun tasks (and a bare single
        # process) have none: it must name the device this rank already uses (distributed.device_for).
        os.environ["LOCAL_RANK"] = str(self.device.index if self.device.type == "cuda" else self.env.local_rank)
        self.blocks = prepare_blocks(model, self.cfg.model, self.cfg.strategy)
        if not train:
            with quiet.deepspeed_build_notice():
                self.engine, _, _, _ = deepspeed.initialize(model=model.to(self.device),
                                                            config=self._forward_config())
            self.model = self.engine
            return self.engine  # type: ignore[no-any-return]
        with quiet.deepspeed_build_notice():
            engine, optimizer, _, _ = deepspeed.initialize(
                model=model.to(self.device), optimizer=self._client_optimizer(model),
                config=copy.deepcopy(self.ds_config),
            )
        self.engine = self.model = engine
        self.optimizer = optimizer
        # The torch optimizer inside DeepSpeed's wrapper: its param_groups are the ones the engine steps with
        # (DeepSpeed points their "params" at its fp32 partitions and keeps lr, betas and weight decay).
        self.basic_optimizer = engine.basic_optimizer
        self.scheduler = build_scheduler(self.basic_optimizer, self.cfg.optim, self.cfg.trainer.max_steps)
        return engine  # type: ignore[no-any-return]

    def _forward_config(self) -> dict[str, Any]:
        """This run's DeepSpeed config as ZeRO-3 with nothing of the optimizer (forward only)."""
        from omegaconf import open_dict

        cfg = copy.deepcopy(self.cfg)
        with open_dict(cfg):
            cfg.strategy.zero_stage, cfg.strategy.offload_optimizer = 3, False
        return deepspeed_config(cfg, self.env.world_size, pin_memory=self.device.type == "cuda")

    def replica_set(self) -> tuple[tuple[int, ...], list[tuple[str, torch.Tensor]]]:
        """ZeRO-1/2 keep the module's parameters whole on every rank; ZeRO-3 partitions them."""
        key, named = super().replica_set()
        return key, named if int(self.cfg.strategy.zero_stage) < 3 else []

    def replica_note(self) -> str:
        return f"strategy={self.name} (ZeRO-3) partitions every parameter over the data-parallel ranks"

    def _client_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        o = self.cfg.optim
        refusal = strategy_refusal(o.name, self.cfg.strategy)
        if refusal:  # the launch refused it already; a config.yaml edited by hand gets it here
            raise ConfigError(refusal)
        if not self.cfg.strategy.offload_optimizer:
            why_not = "DeepSpeed's wrapper steps it and can't pass the skip verdict"
            optimizer = build_optimizer(model, o, fused=False, why_not=why_not)
            self.log_kernels(model, optimizer, False, why_not)
            return optimizer
        # ZeRO-Offload refuses other optimizers (zero_force_ds_cpu_optimizer). Its C++ op is built with ninja
        # on first use (about a minute) and cached in ~/.cache/torch_extensions (TORCH_EXTENSIONS_DIR).
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(param_groups(model, o), lr=peak_lr(o), betas=(o.beta1, o.beta2), eps=o.eps,
                                weight_decay=o.weight_decay, adamw_mode=True)

    def _check_precision(self) -> None:
        if self.compute_dtype != torch.float16:
            return
        from deepspeed.accelerator import get_accelerator

        if not get_accelerator().is_fp16_supported():
            raise ValueError(
                f"precision=fp16 with strategy={self.name} needs a device with fp16 support, and DeepSpeed's "
                f"{get_accelerator().device_name()} accelerator has none here: use precision=bf16 or precision=fp32"
            )

    # -- one optimizer step --------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the engine already holds the module in the compute dtype

    @contextlib.contextmanager
    def accumulation(self, is_last_micro_step: bool) -> Iterator[None]:
        self._last_micro_step = is_last_micro_step
        yield

    def backward(self, loss: torch.Tensor) -> None:
        # The loop already divided the loss by the accumulation steps; DeepSpeed must not do it again.
        self.engine.backward(loss, scale_wrt_gas=False)
        if not self._last_micro_step:
            # DeepSpeed counts micro steps in step(): off the boundary it only advances the counter.
            self.engine.step()

    def optimizer_step(self, check: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | float:
        """Reduce, unscale, clip and step (all inside engine.step()), then schedule; returns the gradient norm as
        the engine keeps it (a tensor, or a float), unread. The engine applies its update itself: `check` sees the
        norm only after it (a non-finite step is rolled back, not skipped: train/stability/runner.py).

        The engine itself reads values every step, which no setting turns off (train/observe/sync_count.py counts
        them, tests/dist/test_sync_free.py names them): its overflow check of the gradient norm, the client
        optimizer's step counts, and with ZeRO-3 its parameter coordinator's checks in forward."""
        assert self.scheduler is not None
        if not self.engine.is_gradient_accumulation_boundary():
            raise RuntimeError(
                f"DeepSpeed is not at a gradient accumulation boundary after {self.cfg.trainer.grad_accum_steps} "
                f"micro steps: its config (gradient_accumulation_steps="
                f"{self.ds_config['gradient_accumulation_steps']}) disagrees with the loop"
            )
        self.engine.step()
        self.scheduler.step()
        norm = self.engine.get_global_grad_norm()
        norm = 0.0 if norm is None else norm
        if check is not None:
            check(torch.as_tensor(norm, device=self.device))
        return norm  # type: ignore[no-any-return]

    def current_lr(self) -> float:
        assert self.basic_optimizer is not None
        return float(self.basic_optimizer.param_groups[0]["lr"])

    def loss_scale(self) -> float | None:
        """DeepSpeed's dynamic fp16 loss scale, held by its ZeRO optimizer (None unless fp16)."""
        if self.compute_dtype != torch.float16:
            return None
        scale = getattr(self.engine.optimizer, "loss_scale", None)
        return None if scale is None else float(scale)
