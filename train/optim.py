"""The optimizer (optim.name: contract/rules/optimizers.py) over its parameter groups, and its learning-rate schedule
(optim.schedule, closed forms of the step in contract/rules/schedules.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from contract.errors import ConfigError
from contract.rules.schedules import Schedule
from contract.rules.schedules import cosine_factor as lr_factor  # noqa: F401 - the default schedule, by its old name

# The optim.no_decay kinds that name modules, not parameters.
_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer: torch's, or any class named like one (ours, Hugging Face's LlamaRMSNorm)."""
    return isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()


def parameter_kinds(model: nn.Module) -> dict[int, set[str]]:
    """Each parameter (by id; a tied one once) and the optim.no_decay kinds it belongs to."""
    kinds: dict[int, set[str]] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            k = kinds.setdefault(id(p), set())
            if is_norm(module):
                k.add("norm")
            if isinstance(module, nn.Embedding):
                k.add("embedding")
            if name == "bias" or name.endswith("_bias"):
                k.add("bias")
            if p.dim() < 2:
                k.add("vector")
    return kinds


def param_groups(model: nn.Module, optim: Any, hidden: Iterable[nn.Parameter] = ()) -> list[dict[str, Any]]:
    """Trainable parameters grouped by whether weight decay applies (not to the kinds optim.no_decay names) and,
    for optim=muon, whether Muon steps them (`hidden`: the 2-D weights of the model's blocks). Empty groups are
    left out (DCP takes at most one)."""
    kinds, skip = parameter_kinds(model), set(optim.get("no_decay", ["vector"]))
    muon = {id(p) for p in hidden}
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            groups.setdefault((id(p) in muon, not kinds[id(p)] & skip), []).append(p)
    weight_decay = float(optim.weight_decay)
    out = []
    for is_muon, decays in ((True, True), (True, False), (False, True), (False, False)):
        if groups.get((is_muon, decays)):
            group = {"params": groups[(is_muon, decays)], "weight_decay": weight_decay if decays else 0.0}
            out.append(group | ({"muon": is_muon} if optim.get("name") == "muon" else {}))
    return [part for group in out for part in _by_kind(group)]


def _by_kind(group: dict[str, Any]) -> list[dict[str, Any]]:
    """A group holding both DTensors (FSDP's shards) and whole tensors of 1 or more dims (parallel.ep's experts, which
    FSDP leaves alone) as two groups of the same settings: a fused or foreach kernel takes one kind per call (a 0-dim
    tensor goes with DTensors as a scalar)."""
    whole = [p for p in group["params"] if not isinstance(p, DTensor) and p.dim()]
    if not whole or len(whole) == len(group["params"]):
        return [group]
    own = {id(p) for p in whole}
    return [group | {"params": [p for p in group["params"] if id(p) not in own]}, group | {"params": whole}]


def hidden_matrices(blocks: Iterable[nn.Module]) -> list[nn.Parameter]:
    """The 2-D weights of the model's repeated blocks: what Muon steps."""
    return [p for block in blocks for p in block.parameters() if p.requires_grad and p.dim() == 2]


def peak_lr(cfg: Any) -> float:
    """The launch plan's learning rate (optim.lr after optim.lr_scaling); optim.lr where no plan derived it."""
    return float(cfg.scaled_lr if cfg.get("scaled_lr") is not None else cfg.lr)


def kernel_choice(params: Iterable[torch.Tensor], fused: bool = True, why_not: str = "") -> tuple[str, str]:
    """Which kernels the optimizer steps with, and why: "fused" (one kernel for all parameters, no per-tensor
    launches) wherever the parameters allow, all on one device of a type torch's fused AdamW supports and all
    floating point (DTensor shards of FSDP and tensor parallelism included: their local shards are stepped);
    "foreach" otherwise, or when the caller can't use fused kernels (`fused` false, `why_not` says why)."""
    if not fused:
        return "foreach", why_not or "fused kernels not wanted here"
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    devices, odd = set(), None
    for p in params:
        devices.add(str(p.device))
        if p.device.type not in supported or not torch.is_floating_point(p):
            odd = odd or f"a parameter is {p.dtype} on {p.device}"
    if odd:
        return "foreach", f"{odd}, which torch's fused kernels do not take"
    if len(devices) > 1:
        return "foreach", f"the parameters are spread over {len(devices)} devices ({', '.join(sorted(devices))})"
    return "fused", f"every parameter on {next(iter(devices), 'no device')}"


def build_optimizer(model: nn.Module, cfg: Any, fused: bool = True, blocks: Iterable[nn.Module] = (),
                    why_not: str = "") -> torch.optim.Optimizer:
    """The optimizer optim.name names. Each takes the stability verdict as `found_inf` and skips a step without
    applying it (train/stability/verdict.py): AdamW and SGD fused (one kernel per step, on CPU and GPU alike) on the
    device, Muon on the device, Adafactor, Lion and SGD over DTensors on the host. `fused=False`: foreach kernels (DeepSpeed's wrapper
    steps it itself; fp16's GradScaler skips steps itself). `blocks`: the model's repeated blocks, whose matrices
    Muon steps. kernel_choice says which kernels the parameters allow (`why_not`: why `fused` is false)."""
    name, lr = cfg.get("name", "adamw"), peak_lr(cfg)
    kind, _ = kernel_choice(model.parameters(), fused, why_not)
    kernels = {kind: True}
    fused = kind == "fused"
    if name == "adamw":
        return torch.optim.AdamW(param_groups(model, cfg), lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kernels)
    if name == "sgd":
        from train.optimizers.host_skip import SGD

        sharded = any(isinstance(p, DTensor) for p in model.parameters())  # fused SGD has no DTensor rule
        return SGD(param_groups(model, cfg), lr=lr, momentum=float(cfg.momentum), nesterov=bool(cfg.nesterov),
                   **({"foreach": True} if sharded else kernels))
    if name == "adafactor":
        from train.optimizers.adafactor import Adafactor

        return Adafactor(param_groups(model, cfg), lr=lr, beta2_decay=float(cfg.beta2_decay), d=float(cfg.clip_threshold))
    if name == "lion":
        from train.optimizers.host_skip import Lion

        return Lion(param_groups(model, cfg), lr=lr, betas=(cfg.beta1, cfg.beta2))
    if name == "muon":
        from train.optimizers.muon import MuonWithAdamW

        hidden = hidden_matrices(blocks)
        if not hidden:
            raise ConfigError("optim=muon steps the 2-D weights of the model's repeated blocks, and none were found: "
                              "name the block class with model.block=ClassName, or choose optim=adamw")
        return MuonWithAdamW(param_groups(model, cfg, hidden), lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             momentum=float(cfg.momentum), nesterov=bool(cfg.nesterov), ns_steps=int(cfg.ns_steps),
                             fused=fused)
    raise ConfigError(f"optim.name={name} is not an optimizer slurmtrain implements")


class StepSchedule(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR over a Schedule, whose only state is the step: a resume sets every group's rate to the closed form
    of this run's config at the restored step. (LambdaLR restored its saved base rates and left the optimizer's
    restored rate, the old schedule's, for the first step: an extended run trained one step at the old end's rate
    and jumped at the next.)"""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule) -> None:
        self.schedule = schedule
        super().__init__(optimizer, lambda n: schedule.factor(n))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("schedule")  # the config says it; checkpoints hold plain values only
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes only the step from a saved state (ours, or torch's LambdaLR's in older checkpoints)."""
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        factor = self.schedule.factor(self.last_epoch)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, max_steps: int) -> StepSchedule:
    # The schedule is read from the config once, not at every step (OmegaConf attribute access is slow).
    return StepSchedule(optimizer, Schedule.from_config(cfg, max_steps))
