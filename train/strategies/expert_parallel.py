"""Expert parallelism (parallel.ep=N): each MoE layer's experts split over N neighbouring data-parallel ranks.

As torchtitan and Megatron-Core lay it out, the ep ranks are taken from the data-parallel ones: data-parallel
rank r is ep rank r mod N, and holds experts [ep_rank x E/N, (ep_rank + 1) x E/N); the ranks r, r + N, r + 2N ...
(the "edp" group) hold the same experts. A MoE layer's tokens, grouped by expert, go to their experts' rank by one
all-to-all with uneven splits and come back by another (`run_experts`; autograd runs both the other way); an expert
runs on each source rank's rows apart, the products an ep=1 rank computes; an expert's gradient is summed over the
ranks in another order, so the losses are ep=1's bit for bit on 2 ranks and to fp32 rounding on more
(docs/strategies.md).

Dense parameters stay with the strategy (DDP replicates them, FSDP/HSDP shards them as always); the expert
parameters are left out of its wrapping and handled here:
    gradients   each rank's expert gradients hold every ep peer's tokens' contribution; summed over the edp group
                and divided by the data-parallel size, they are the mean over the data-parallel ranks that DDP and
                FSDP give the dense ones (`reduce_gradients`, before clipping)
    clipping    the global norm adds the experts' squares summed over the ep group (`clip_gradients`)
    checkpoints an expert tensor (and its optimizer moments) is saved as a DTensor sharded by experts over the ep
                ranks (replicated over edp), so DCP reads it back under another ep size or world size
                (`globalize` / `localize`, train/checkpoints/state.py)

The split sizes of an all-to-all are read on the host (as every dropless EP implementation does): a MoE layer
under ep > 1 waits for its router once per forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from train.model.moe import Experts, moe_layers
from train.strategies.grads import all_reduce_flat, total_norm


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int],  # type: ignore[override]
                group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    """Rows of `x` split by `in_splits` to each rank of `group`; `out_splits` rows come from each (differentiable)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)  # type: ignore[no-any-return]


def run_experts(experts: Experts, rows: torch.Tensor, counts: torch.Tensor, group: Any) -> torch.Tensor:
    """`rows` grouped by expert (`counts[e]` for each of all E experts) through their experts on whichever ep rank
    holds them, back in the same order."""
    ep, local = dist.get_world_size(group), experts.count
    received_counts = torch.empty_like(counts)
    dist.all_to_all_single(received_counts, counts, group=group)  # [source rank, my expert]
    by_source = received_counts.view(ep, local)
    host = torch.stack([counts.view(ep, local).sum(1), by_source.sum(1)]).tolist()
    send, receive = host[0], host[1]
    received = all_to_all(rows, receive, send, group)
    # Arrived grouped by source rank, then expert: each source's rows go through each expert on their own, the same
    # matrix products an ep=1 rank computes on its own tokens (the results do not depend on ep; nor the gradients
    # of 2 ranks, whose sum is the same either way).
    out = experts(received, by_source.reshape(-1).tolist(), list(range(local)) * ep)
    return all_to_all(out, send, receive, group)


class ExpertParallel:
    """The ep and edp groups of this rank and the expert parameters it holds (set up by `shard`)."""

    def __init__(self, ep: int, device_type: str) -> None:
        world = dist.get_world_size()
        self.ep, self.edp = ep, world // ep  # edp: the ranks holding the same experts
        self.mesh: DeviceMesh = init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("edp", "ep"))
        self.ep_group = self.mesh.get_group("ep")
        self.edp_group = self.mesh.get_group("edp")
        self.ep_rank = self.mesh.get_local_rank("ep")
        self.dp_size = world
        self.names: list[str] = []  # the expert parameters' names in the unwrapped model
        self.params: list[nn.Parameter] = []

    def shard(self, model: nn.Module) -> None:
        """Keep this rank's experts of every MoE layer (every rank built the same full model from the same seed)."""
        for name, layer in moe_layers(model):
            experts = layer.experts
            local = experts.total // self.ep
            first = self.ep_rank * local
            for pname in ("gate", "up", "down"):
                full = getattr(experts, pname)
                if full is None:
                    continue
                part = nn.Parameter(full.detach()[first:first + local].clone(), requires_grad=full.requires_grad)
                setattr(experts, pname, part)
                self.names.append(f"{name}.experts.{pname}")
                self.params.append(part)
            experts.first, experts.count = first, local
            layer.ep_group, layer.dispatch = self.ep_group, run_experts

    def owns(self, p: torch.Tensor) -> bool:
        return any(p is q for q in self.params)

    def reduce_gradients(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        all_reduce_flat(grads, self.edp_group if self.mesh.size(0) > 1 else None, self.dp_size)

    def clip_gradients(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        own = {id(p) for p in self.params}
        dense = [p.grad for p in params if p.grad is not None and id(p) not in own]
        experts = [p.grad for p in self.params if p.grad is not None]
        dense_norm = total_norm(dense)
        expert_sq = torch.nn.utils.get_total_norm(experts).pow(2) if experts else torch.zeros(())
        expert_sq = expert_sq.to(dense_norm)
        dist.all_reduce(expert_sq, group=self.ep_group)
        norm = self._total_norm(dense_norm, expert_sq)
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        local = [g.to_local() if isinstance(g, DTensor) else g for g in dense + experts]
        torch._foreach_mul_(local, coefficient)
        return norm

    def _total_norm(self, dense_norm: torch.Tensor, expert_sq: torch.Tensor) -> torch.Tensor:
        """The global norm from the dense gradients' norm and the experts' squared norm (summed over ep ranks)."""
        return (dense_norm.pow(2) + expert_sq).sqrt()

    # -- checkpoints --------------------------------------------------------------------------------------------
    def _is_expert(self, key: str) -> bool:
        return any(key == n or key.endswith("." + n) for n in self.names)

    def _global(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or isinstance(t, DTensor):
            return t
        return DTensor.from_local(t, self.mesh, [Replicate(), Shard(0)], run_check=False)

    def globalize(self, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        """The expert entries of a state dict (as get_state_dict gives it) as DTensors of every expert, in place."""
        for key in [k for k in model_sd if self._is_expert(k)]:
            model_sd[key] = self._global(model_sd[key])
        states = optim_sd.get("state", {})
        for key, state in list(states.items()):
            if self._is_expert(str(key)):
                # A new dict: get_state_dict hands out the optimizer's own per-parameter dicts, and replacing the
                # moments in them left the optimizer stepping DTensor moments of local parameters (the step after
                # every save under ep>1 failed: "mixed torch.Tensor and DTensor").
                states[key] = {name: self._global(value) for name, value in state.items()}

    @staticmethod
    def localize(model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
        """The inverse, after a load: this rank's slice of each expert DTensor."""
        for key, value in list(model_sd.items()):
            if isinstance(value, DTensor) and value.device_mesh.mesh_dim_names == ("edp", "ep"):
                model_sd[key] = value.to_local()
        for state in optim_sd.get("state", {}).values():
            for name, value in list(state.items()):
                if isinstance(value, DTensor) and value.device_mesh.mesh_dim_names == ("edp", "ep"):
                    state[name] = value.to_local()


def expert_parallel_of(model: nn.Module) -> ExpertParallel | None:
    return getattr(model, "_expert_parallel", None)


def apply_expert_parallel(model: nn.Module, cfg: Any, device_type: str) -> ExpertParallel | None:
    """parallel.ep > 1: shard `model`'s experts; the returned object is also kept on the model (checkpoints find it)."""
    parallel = cfg.get("parallel")
    ep = int(parallel.get("ep", 1)) if parallel is not None else 1
    if ep == 1:
        return None
    expert_parallel = ExpertParallel(ep, device_type)
    expert_parallel.shard(model)
    object.__setattr__(model, "_expert_parallel", expert_parallel)  # not a submodule: no state of its own
    return expert_parallel
