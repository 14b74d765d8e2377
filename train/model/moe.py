"""The mixture-of-experts feed-forward (model.moe): a router in fp32, top-k token choice, experts as stacked weights.

    MoE           router -> top_k experts per token (weights renormalised, as Mixtral) -> experts -> weighted sum,
                  plus optional shared experts; the auxiliary losses join the training loss through AuxLoss
    Experts       num_experts MLPs as [experts, ...] tensors (torchtitan's GroupedExperts, Mixtral's layout): under
                  expert parallelism (train/strategies/expert_parallel.py) a rank holds a slice of them and the
                  tokens travel to it by all-to-all (`dispatch`)
    AuxLoss       adds a loss to the backward without changing the forward (Megatron's MoEAuxLossAutoScaler): the
                  layer's load-balancing and z-losses reach its router wherever the layer runs (an accumulation
                  step, a pipeline stage, a recomputed block) without the step collecting them

Routing (per micro batch, on each rank's own tokens): probabilities = softmax(router logits in fp32); a token's
top_k experts; with capacity_factor > 0, an expert takes at most ceil(cf x tokens x top_k / experts) assignments in
token order and drops the rest (the token's residual stream passes that expert by). Dropless otherwise.
Under context parallelism (a rank holds two chunks of each sequence) a token is routed on its own rank as without
cp, and the load-balancing fraction is the whole sequences' (`_sequence_routing`), so the losses are cp=1's.
Under tensor parallelism (train/strategies/tensor_parallel.py) a MoE layer runs on the rank's slice of the sequence
(the sequence-parallel norm's output) with weights replicated over the tp ranks: the same rule, over the tp group
(`SequenceSlice`), the auxiliary losses weighted 1/tp since the strategy sums the layer's gradients over tp.

Telemetry stays on the device: each layer adds its tokens per expert, dropped assignments and auxiliary losses to
running sums that train/observe/moe_stats.py reads (and resets) at log steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from train.model.mlp import MLP


def moe_config(cfg: Any) -> Any:
    """cfg.model.moe, or None for a dense model (a config.yaml saved before model.moe existed is dense)."""
    moe = getattr(cfg, "moe", None) if not isinstance(cfg, dict) else cfg.get("moe")
    if moe is None:
        return None
    experts = moe.get("num_experts", 0) if isinstance(moe, dict) else getattr(moe, "num_experts", 0)
    return moe if experts else None


def is_moe_layer(moe: Any, layer: int) -> bool:
    return moe is not None and (layer + 1) % int(moe.every) == 0


class AuxLoss(torch.autograd.Function):
    """Identity on `x`; in backward, `loss` gets the gradient `scale` (the step's 1 / accumulation steps, set by
    train/step.py) times `loss_scale` (fp16's loss scale, a device tensor, set by the strategy's backward), as if
    `loss x scale` had been added to the loss the step backpropagates."""

    scale: float = 1.0
    loss_scale: torch.Tensor | None = None

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(loss)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        (loss,) = ctx.saved_tensors
        injected = torch.full_like(loss, AuxLoss.scale)
        if AuxLoss.loss_scale is not None:
            injected = injected * AuxLoss.loss_scale.to(injected)
        return grad, injected


class Experts(nn.Module):
    """`count` experts (of `total`, starting at `first`): SwiGLU (gate, up, down) or GELU (up, down) weights as
    [experts, out, in] tensors, Mixtral's per-expert Linear layout stacked."""

    def __init__(self, cfg: Any, total: int) -> None:
        super().__init__()
        d, hidden = cfg.d_model, cfg.ffn_hidden
        self.total, self.first, self.count = total, 0, total
        self.gate = nn.Parameter(torch.empty(total, hidden, d)) if cfg.mlp == "swiglu" else None
        self.up = nn.Parameter(torch.empty(total, hidden, d))
        self.down = nn.Parameter(torch.empty(total, d, hidden))

    def forward(self, x: torch.Tensor, counts: list[int], which: list[int] | None = None) -> torch.Tensor:
        """`x`: rows in groups of `counts`, group i for this module's expert `which[i]` (default: expert i)."""
        outs = []
        for i, rows in enumerate(x.split(counts)):
            e = i if which is None else which[i]
            if self.gate is not None:
                h = F.silu(rows @ self.gate[e].t()) * (rows @ self.up[e].t())
            else:
                h = F.gelu(rows @ self.up[e].t(), approximate="tanh")
            outs.append(h @ self.down[e].t())
        return torch.cat(outs) if outs else x.new_zeros(0, x.shape[-1])


class MoE(nn.Module):
    # False while a pipeline stage infers its shapes (train/strategies/pipeline.py): a forward on empty tensors.
    counting: bool = True

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        moe = cfg.moe
        self.num_experts, self.top_k = int(moe.num_experts), int(moe.top_k)
        self.capacity_factor = float(moe.capacity_factor)
        self.aux_coef, self.z_coef = float(moe.aux_loss_coef), float(moe.z_loss_coef)
        self.router = nn.Linear(cfg.d_model, self.num_experts, bias=False)
        self.experts = Experts(cfg, self.num_experts)
        shared = int(moe.shared_experts)
        self.shared = MLP(_widened(cfg, shared)) if shared else None
        # Expert parallelism (train/strategies/expert_parallel.py sets both): the group this layer's experts span,
        # and how rows reach the experts on the ranks that hold them (its run_experts).
        self.ep_group: Any = None
        self.dispatch: Any = None
        # Context parallelism (train/strategies/context_parallel.py attach sets both): the ranks sharing each
        # sequence, and the rank's ContextShard (which chunks of a sequence it holds).
        self.cp_group: Any = None
        self.context: Any = None
        # Tensor parallelism (train/strategies/tensor_parallel.py sets it): a SequenceSlice of the tp group.
        self.tp_slice: SequenceSlice | None = None
        self.stats: MoEStats | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        n, k, experts = flat.shape[0], self.top_k, self.num_experts
        logits = F.linear(flat.float(), self.router.weight.float())  # fp32 router, under autocast too
        probs = logits.softmax(dim=-1)
        weights, chosen = probs.topk(k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        expert_of = chosen.reshape(-1)  # assignments, token-major: token i's k choices at i*k ... i*k+k-1
        routed = torch.bincount(expert_of, minlength=experts)
        keep = None
        if self.capacity_factor > 0:
            keep = (self._within_capacity(expert_of, n * k) if self.context is None and self.tp_slice is None
                    else self._sequence_capacity(chosen.view(shape[0], -1, k)))
        aux = self._aux_losses(logits, probs, *self._sequence_routing(routed, n * k))
        token_of = torch.arange(n, device=x.device).repeat_interleave(k)
        gate_weights = weights.reshape(-1)
        if keep is not None:
            expert_of, token_of, gate_weights = expert_of[keep], token_of[keep], gate_weights[keep]
        order = torch.argsort(expert_of, stable=True)
        counts = torch.bincount(expert_of, minlength=experts)
        rows = flat[token_of[order]]
        if self.ep_group is None:
            out_rows = self.experts(rows, counts.tolist())
        else:
            out_rows = self.dispatch(self.experts, rows, counts, self.ep_group)
        out_rows = out_rows * gate_weights[order].unsqueeze(-1).to(out_rows.dtype)
        out = torch.zeros_like(flat, dtype=out_rows.dtype).index_add_(0, token_of[order], out_rows).to(x.dtype)
        # Counted once per training forward: not again when activation checkpointing recomputes it inside backward,
        # nor in a pipeline stage's shape inference (without gradients).
        if self.training and MoE.counting and torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            if self.stats is None:
                self.stats = MoEStats(experts, x.device)
            self.stats.add(routed, (~keep).sum() if keep is not None else None, aux)
        if self.training and (self.aux_coef or self.z_coef):
            weight = 1.0 if self.tp_slice is None else 1.0 / self.tp_slice.size  # tp: gradients summed over tp
            out = AuxLoss.apply(out, (self.aux_coef * aux[0] + self.z_coef * aux[1]) * weight)
        out = out.reshape(shape)
        return out + self.shared(x) if self.shared is not None else out

    def _within_capacity(self, expert_of: torch.Tensor, assignments: int) -> torch.Tensor:
        """Which assignments (token-major) their expert takes: its first ceil(cf x assignments / experts)."""
        capacity = math.ceil(self.capacity_factor * assignments / self.num_experts)
        one_hot = F.one_hot(expert_of, self.num_experts)
        position = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)  # each assignment's place in its expert's queue
        return position < capacity

    def _sequence_capacity(self, chosen: torch.Tensor) -> torch.Tensor:
        """Under context or tensor parallelism: the queues of one rank, in the whole micro batch's token order. The
        group's choices ([b, t_local, k] each) are all-gathered into whole sequences (the tp slices, then the cp
        chunks), every rank computes the same queue positions, and keeps those of its own tokens."""
        whole = chosen if self.tp_slice is None else self.tp_slice.whole_sequence(chosen)
        whole = whole if self.context is None else self.context.whole_sequence(whole)  # [b, T, k]
        keep = self._within_capacity(whole.reshape(-1), whole.numel()).view(whole.shape)
        keep = keep if self.context is None else self.context.local(keep, dim=1)
        return (keep if self.tp_slice is None else self.tp_slice.local(keep)).reshape(-1)

    def _sequence_routing(self, routed: torch.Tensor, assignments: int) -> tuple[torch.Tensor, int]:
        """The routed counts and assignments the load-balancing fraction is over: this rank's, or under context
        parallelism the whole sequences' (summed over the cp ranks, one small all-reduce). With the whole fraction
        and this rank's mean probabilities, the mean of the cp ranks' balance losses is cp=1's, and so is the
        mean of their gradients (each rank's is its own tokens' share, times cp, as the cross-entropy's)."""
        tp_group = self.tp_slice.group if self.tp_slice is not None else None
        groups = [g for g in (self.cp_group, tp_group) if g is not None]
        if not groups:
            return routed, assignments
        whole = routed.clone()
        for group in groups:  # each tp rank holds an equal slice of its cp chunks (the plan's seq_len rule)
            dist.all_reduce(whole, group=group)
            assignments *= dist.get_world_size(group)
        return whole, assignments

    def _aux_losses(self, logits: torch.Tensor, probs: torch.Tensor, routed: torch.Tensor,
                    assignments: int) -> torch.Tensor:
        """[load-balancing loss, router z-loss] of this micro batch (each 0-dim, fp32)."""
        fraction = routed.float() / max(assignments, 1)
        balance = self.num_experts * (fraction * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return torch.stack([balance, z])


class SequenceSlice:
    """A tensor-parallel rank's slice of the sequence (dimension 1, torch.chunk's split, as DTensor's Shard(1)): the
    whole of a [b, t_local, ...] tensor gathered from the group, and this rank's slice of a whole one."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def whole_sequence(self, x: torch.Tensor) -> torch.Tensor:
        lengths = torch.tensor([x.shape[1]], device=x.device)
        every = [torch.empty_like(lengths) for _ in range(self.size)]
        dist.all_gather(every, lengths, group=self.group)
        sizes = [int(n) for n in torch.cat(every).tolist()]
        longest = max(sizes)
        padded = torch.cat([x, x.new_zeros(x.shape[0], longest - x.shape[1], *x.shape[2:])], dim=1)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat([part[:, :n] for part, n in zip(parts, sizes, strict=True)], dim=1)

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return x.chunk(self.size, dim=1)[self.rank]


class MoEStats:
    """One layer's running sums since the last log step, on the device: routed tokens per expert, dropped
    assignments, the auxiliary losses and how many micro batches added to them."""

    def __init__(self, experts: int, device: torch.device) -> None:
        self.load = torch.zeros(experts, device=device)
        self.dropped = torch.zeros((), device=device)
        self.losses = torch.zeros(2, device=device)
        self.calls = torch.zeros((), device=device)

    def add(self, routed: torch.Tensor, dropped: torch.Tensor | None, losses: torch.Tensor) -> None:
        self.load += routed.detach()
        if dropped is not None:
            self.dropped += dropped
        self.losses += losses.detach()
        self.calls += 1

    def reset(self) -> None:
        for t in (self.load, self.dropped, self.losses, self.calls):
            t.zero_()


def _widened(cfg: Any, shared: int) -> Any:
    """cfg with ffn_hidden x shared: the shared experts as one MLP (the sum of `shared` MLPs is one of their width)."""
    from types import SimpleNamespace

    return SimpleNamespace(d_model=cfg.d_model, ffn_hidden=cfg.ffn_hidden * shared, mlp=cfg.mlp)


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]


def active_fraction(moe: Any) -> float:
    """Of a MoE layer's expert parameters, the share a token uses: top_k / num_experts."""
    return int(moe.top_k) / int(moe.num_experts)
