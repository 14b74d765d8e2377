"""The strategy protocol and the torch-native implementation the wrappers share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError
from contract.rules import float8
from train.model.blocks import blocks_for, prepare_blocks
from train.model.moe import AuxLoss
from train.optim import build_optimizer, build_scheduler, kernel_choice
from train.stability.verdict import apply_with_skip
from train.strategies.expert_parallel import apply_expert_parallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Strategy:
    """How a model is wrapped, how gradients are produced and applied.

    Subclasses override `wrap` (and, for engines that own the optimizer, the step methods). Activation
    checkpointing and torch.compile are applied per transformer block before wrapping, for every strategy.
    """

    name = "base"
    # How model and optimizer state are saved (train/checkpoints/manager.py): "dcp" or "deepspeed".
    checkpoint_format = "dcp"

    def __init__(self, cfg: Any, env: Any, device: torch.device) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.name = cfg.strategy.name
        self.compute_dtype = DTYPES[cfg.precision.compute_dtype]
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        # Loss scaling for fp16 (None otherwise); part of the checkpointed training state.
        self.scaler: Any = None
        # The model's repeated blocks (train/model/blocks.py), after activation checkpointing: FSDP's units.
        self.blocks: list[nn.Module] = []
        # Tensor / pipeline parallel layout (train/strategies/mesh.py), or None; the data-parallel coordinates
        # decide which samples this rank trains on (tensor-parallel peers and a replica's stages share them).
        self.layout: Any = None
        self.dp_rank, self.dp_size = env.rank, env.world_size
        # Context parallelism (parallel.cp, train/strategies/context_parallel.py): the ranks that share each
        # sequence, and this rank's share (None without).
        self.cp: int = 1
        self.context: Any = None
        # A pipeline stage runs whole steps through its schedule (train/strategies/pipeline.py); with an
        # interleaved schedule a rank runs several stages (`parts`, views of its model), else the model is the part.
        self.pipeline: Any = None
        self.parts: list[nn.Module] = []
        p = cfg.get("parallel")
        self.virtual_stages = int(p.pp_virtual_stages) if p is not None and p.pp_schedule == "interleaved_1f1b" else 1
        # Read once: an OmegaConf attribute costs tens of microseconds, paid every step on the critical path.
        self.grad_clip = float(cfg.optim.grad_clip)
        # parallel.ep > 1: the expert parameters' groups and handling (set in setup).
        self.expert_parallel: Any = None
        # parallel.tp with a MoE model: the parameters each tp rank holds whole (train/strategies/tensor_parallel.py).
        self.tp_replicated: list[nn.Parameter] = []
        # False after setup(train=False): forward only (an evaluation job), no optimizer and no gradient buffers.
        self.trains = True
        # precision=fp8 under FSDP2 with tensorwise scaling: weights all-gathered in float8 (train/model/float8.py).
        self.float8_all_gather = False
        # strategy.grad_compression's DDP hook and its per-rank state (train/strategies/grad_compression.py), or None.
        self.compression: Any = None
        # parallel.replica_groups (train/replicas): the groups the data-parallel ranks are split into; dp_rank and
        # dp_size then count every group's ranks, and `replicas` averages the gradients across the groups.
        self.replica_groups = 1
        self.replicas: Any = None
        # trainer.loss_impl=fused: our transformer's forward takes the targets and returns the loss
        # (train/model/fused_head.py).
        self.fused_loss = False

    # -- set-up --------------------------------------------------------------------------------------------
    @classmethod
    def refusal(cls, name: str, model: nn.Module, blocks: list[tuple[str, nn.Module]],
                unused: list[str] | None) -> str | None:
        """Why strategy `name` can't train `model` (one line naming the parameters and the fix), or None.
        `blocks`: the model's blocks for this config; `unused`: trainable parameters the forward leaves without a
        gradient, or None when unknown (the launch probe runs a forward on the meta device, the ranks don't).
        train/strategies/limits.py has the checks."""
        return None

    def check_model(self, model: nn.Module) -> None:
        """The launch probe's refusal again, on the ranks: a model the probe could not build gets it here."""
        reason = self.refusal(self.name, model, blocks_for(model, self.cfg.model, self.cfg.strategy), None)
        if reason:
            raise ConfigError(reason)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def make_scaler(self) -> Any:
        return torch.amp.GradScaler(self.device.type)

    def setup(self, model: nn.Module, train: bool = True) -> nn.Module:
        """Place and wrap the model and build its optimizer and schedule. train=False: forward only (an evaluation
        job), the model placed and sharded as training has it, with no optimizer, schedule or their state."""
        from train.strategies.mesh import build_layout, model_parallel

        self.trains = train
        self.check_model(model)
        from train.model.fused_head import attach as attach_fused_loss

        self.fused_loss = attach_fused_loss(model, self.cfg)
        if float8.enabled(self.cfg.precision):  # before compile and wrapping (torchtitan's order)
            from train.model.float8 import convert

            converted = convert(model, self.cfg, self.device)
            self.float8_all_gather = float8.fp8_all_gather(self.cfg)
            if getattr(self.env, "is_main", False):
                from train.observe.metrics import log

                log.info("precision fp8: %d linear layers in float8 (%s scaling%s)", converted,
                         self.cfg.precision.float8_recipe,
                         ", all-gathered in float8 by FSDP2" if self.float8_all_gather else "")
        if model_parallel(self.cfg):
            from train.strategies.pipeline import rank_layers
            from train.strategies.tensor_parallel import apply_tensor_parallel

            self.layout = build_layout(self.cfg, self.env, self.device.type)
            self.dp_rank, self.dp_size = self.layout.dp_rank, self.layout.dp
            if self.layout.cp > 1:
                from train.strategies.context_parallel import ContextShard, attach

                self.cp, mesh = self.layout.cp, self.layout.mesh["cp"]
                self.context = ContextShard(mesh.get_group(), self.cp, self.layout.cp_rank, mesh,
                                            cuda=self.device.type == "cuda")
                attach(model, self.context)
            if self.layout.pp > 1:  # this rank's stages: their layers only (names kept, for checkpoints)
                layers = rank_layers(self.cfg.model.n_layers, self.layout.pp, self.virtual_stages,
                                     self.layout.pp_rank)
                model.keep_layers(layers)  # type: ignore[operator]
            model = model.to(self.device)
            if self.layout.tp > 1:
                apply_tensor_parallel(model, self.layout.mesh["tp"])
        # parallel.ep: this rank's experts only, left out of the wrapping below (train/strategies/expert_parallel.py).
        if self.layout is not None and self.layout.pp * self.layout.tp > 1:  # a stage and tp index: its data ranks
            from train.strategies.expert_stages import apply_stage_expert_parallel

            self.expert_parallel = apply_stage_expert_parallel(model, self.cfg, self.device.type, self.layout)
        else:
            self.expert_parallel = apply_expert_parallel(model, self.cfg, self.device.type)
        self.blocks = prepare_blocks(model, self.cfg.model, self.cfg.strategy)
        if self.layout is not None and self.layout.pp > 1:
            from train.strategies.pipeline import chunks

            self.parts = chunks(model, self.layout, self.virtual_stages)
        model = self.wrap(model.to(self.device))
        self.compile_whole(model)
        self.model = model
        if self.layout is not None and self.layout.tp > 1:  # MoE layers, whole on every tp rank: gradients summed
            from train.strategies.tensor_parallel import tp_replicated

            self.tp_replicated = tp_replicated(model)
        if train:
            self._build_optimizer(model)
        if self.layout is not None and self.layout.pp > 1:
            from train.strategies.pipeline import Pipeline

            self.pipeline = Pipeline(self, self.parts if self.virtual_stages > 1 else [model])
        return model

    def compile_whole(self, model: nn.Module) -> None:
        """strategy.compile_unit=model: the wrapped model compiled in place, as one graph (names unchanged, so
        checkpoints are the same); strategy.cuda_graphs: in reduce-overhead mode. The launch refused what can't
        take it (contract/rules/compile_modes.py); the ranks check it again, and the device."""
        from contract.rules.compile_modes import compile_mode, compile_refusal

        s = self.cfg.strategy
        if not (s.get("compile") or s.get("cuda_graphs")):
            return
        reason = compile_refusal(self.cfg, self.device.type == "cuda")
        if reason:
            raise ConfigError(reason)
        if s.get("compile_unit", "blocks") == "model":
            mode = compile_mode(s)
            model.compile(**({"mode": mode} if mode else {}))

    def _build_optimizer(self, model: nn.Module) -> None:
        # fp16: GradScaler steps the optimizer and skips overflowing steps itself; torch's fused AdamW can't take its
        # found_inf (shape [1] against the step counts' []), so foreach kernels, as before the stability checks.
        fp16 = self.compute_dtype == torch.float16
        why_not = "fp16's GradScaler skips steps itself" if fp16 else ""
        self.optimizer = build_optimizer(model, self.cfg.optim, fused=not fp16, blocks=self.blocks, why_not=why_not)
        self.log_kernels(model, self.optimizer, not fp16, why_not)
        init_optimizer_state(self.optimizer)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, self.cfg.trainer.max_steps)
        if self.compute_dtype == torch.float16:
            self.scaler = self.make_scaler()

    def split_sequence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's share of full-sequence [batch, seq] tensors (inputs, targets): all of them, or with
        parallel.cp its head and tail chunks."""
        return tensors if self.context is None else tuple(self.context.local(x) for x in tensors)

    def log_kernels(self, model: nn.Module, optimizer: torch.optim.Optimizer, fused: bool, why_not: str) -> None:
        """Rank 0 says once which kernels step the optimizer and why (train/optim.py kernel_choice)."""
        from train.observe.metrics import log

        if not getattr(self.env, "is_main", False):
            return
        name = self.cfg.optim.get("name", "adamw")
        actual = ("fused" if optimizer.defaults.get("fused") else "foreach" if optimizer.defaults.get("foreach")
                  else None)
        if actual is None:
            log.info("optimizer: %s with its own step (no fused or foreach kernels)", name)
            return
        kind, reason = kernel_choice(model.parameters(), fused, why_not)
        if actual != kind:
            reason = f"{name} has no fused kernel for these parameters"
        log.info("optimizer: %s with %s kernels (%s)", name, actual, reason)

    # -- one optimizer step --------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def accumulation(self, is_last_micro_step: bool) -> Iterator[None]:
        """Context for one micro step; wrappers skip the gradient sync unless it is the last."""
        yield

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
            AuxLoss.loss_scale = self.scaler._scale  # a MoE layer's auxiliary losses are scaled alike
        loss.backward()

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clips in place; returns the global norm as a tensor: reading it (float) waits for the device, which
        the loop does only at log steps."""
        assert self.model is not None
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.expert_parallel is not None:
            return self.expert_parallel.clip_gradients(params, max_norm)  # type: ignore[no-any-return]
        if self.layout is not None:
            from train.strategies.pipeline import clip_grad_norm

            return clip_grad_norm(params, max_norm, self.layout)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        # FSDP returns a DTensor holding the global norm.
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def optimizer_step(self, check: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | float:
        """Unscale, clip, step, schedule, zero; returns the gradient norm before clipping (a tensor: no host
        sync). `check` (train/stability): called with the norm before the update, returns 1.0 where the update
        must not be applied, which the fused AdamW honours on the device (parameters, moments and its step count
        untouched). The schedule advances either way: the rate follows the trainer's step."""
        assert self.model is not None and self.optimizer is not None and self.scheduler is not None
        clip = self.grad_clip
        if self.replicas is not None and not self.replicas.average(list(self.model.parameters())):
            self.optimizer.zero_grad(set_to_none=True)  # discarded: a group was lost mid-all-reduce; trained again
            return torch.zeros((), device=self.device)
        if self.tp_replicated:  # a MoE layer's gradients: each tp rank's tokens' share, summed
            from train.strategies.tensor_parallel import sum_replicated_gradients

            sum_replicated_gradients(self.tp_replicated, self.layout.mesh["tp"].get_group())
        if self.expert_parallel is not None:  # the experts' gradients: averaged over data-parallel ranks as the rest
            self.expert_parallel.reduce_gradients()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip_gradients(clip if clip > 0 else float("inf"))
        if self.scaler is not None:
            if check is not None:
                check(norm)  # fp16: the scaler skips non-finite steps itself; the verdict only records
            self.scaler.step(self.optimizer)  # skipped (and the scale lowered) if a gradient overflowed
            self.scaler.update()
        elif check is not None:
            apply_with_skip(self.optimizer, check(norm))
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.float8_all_gather:
            from train.model.float8 import precompute_scales

            precompute_scales(self.model)
        return norm

    def replica_set(self) -> tuple[tuple[int, ...], list[tuple[str, torch.Tensor]]]:
        """What this rank holds bit for bit like its data-parallel replicas (train/stability/replicas.py): a key
        (ranks with equal keys hold identical tensors) and the named tensors, in the same order on each. Here
        every parameter, whole or its tensor-parallel shard, shared by the ranks of the same stage and index."""
        assert self.model is not None
        key = (self.layout.pp_rank, self.layout.tp_rank) if self.layout is not None else ()
        named = list(getattr(self.model, "module", self.model).named_parameters())
        ep = self.expert_parallel
        if ep is not None and ep.edp > 1:  # each ep rank holds other experts: compared within their edp group
            key += (ep.ep_rank,)
        elif ep is not None:  # no expert is held twice; the rest is compared over every replica (it was not at all)
            experts = {id(p) for p in ep.params}
            named = [(n, p) for n, p in named if id(p) not in experts]
        return key, named

    def replica_note(self) -> str:
        """Why replica_set has nothing to compare (logged once when so)."""
        return f"strategy={self.name} has a single data-parallel replica"

    def scaler_state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_scaler_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def current_lr(self) -> float:
        assert self.optimizer is not None
        return float(self.optimizer.param_groups[0]["lr"])

    def loss_scale(self) -> float | None:
        """The current fp16 loss scale (None without loss scaling). Reads the device: for log steps only."""
        return None if self.scaler is None else float(self.scaler.get_scale())


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer state now, exactly as a fresh optimizer's first step finds it.

    Otherwise DCP's get_state_dict creates it at the first save (or at a resume) with a dummy step that also
    advances AdamW's step count, which changes the bias correction and so the training trajectory: after an
    fp16 overflow skipped the first steps, or when staging buffers are allocated before training.
    """
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)  # a step with zero gradients and lr 0: parameters and moments stay unchanged
    for state in optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0
