"""Context parallelism (parallel.cp=N): every sequence split over N ranks, causal attention load-balanced.

The sequence is cut into 2N chunks and rank r keeps chunks r and 2N-1-r (a head and a tail), so every rank has
the same causal work: Megatron-Core's and torch's head-tail load balancing (torch's _HeadTailLoadBalancer orders
the chunks the same way, so its ring attention and ours see the same shards). Each rank embeds only its tokens,
at their positions in the whole sequence (RoPE and learned), and its loss is over its own targets; gradients are
averaged over data-parallel x cp ranks (train/strategies/mesh.py), which is the whole sequence's mean.

Attention, per layer, in one of two forms:
- all-gathered keys and values (Llama 3's long-context training): every rank gathers the group's K/V (an
  autograd all-gather whose backward reduce-scatters, summing each rank's key/value gradients back to their owner)
  and attends its queries to them under the causal mask of its two chunks, and a document mask too
  (data.document_mask): a flex attention BlockMask on CUDA, dense booleans elsewhere. Runs on any device; this is
  the CPU path and every masked, dropout or fp32 case.
- torch's ring attention (torch.distributed.tensor.experimental, as torchtitan uses it) on CUDA for plain causal
  attention in bf16 or fp16 without dropout: K/V blocks rotate round the ring and partial results merge by their
  log-sum-exp. It has no CPU kernel ("aten._scaled_dot_product_flash_attention_for_cpu.default does not have a
  sharding strategy registered").

The model asks this module (its `context` attribute, a ContextShard) for its tokens' positions and for the
attention of each layer; nothing else in the model knows about the split.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from train.model.transformer import repeat_kv


def chunk_positions(seq_len: int, cp: int, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The positions (in the whole sequence) rank `rank` of `cp` holds: its head chunk, then its tail chunk."""
    if seq_len % (2 * cp):
        raise ValueError(f"a sequence of {seq_len} tokens does not split into 2 x cp = {2 * cp} equal chunks")
    c = seq_len // (2 * cp)
    head = torch.arange(rank * c, (rank + 1) * c, device=device)
    tail = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([head, tail])


def gathered_positions(seq_len: int, cp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The positions of an all-gathered sequence: every rank's chunk_positions, in rank order."""
    return torch.cat([chunk_positions(seq_len, cp, r, device) for r in range(cp)])


# torch's ring attention shards the flash / memory-efficient / cuDNN kernels; fp32 on CUDA may pick the math one.
RING_DTYPES = (torch.bfloat16, torch.float16)


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 2) whose backward reduce-scatters: each rank gets the sum of every
    rank's gradient for its own keys and values. The sequence goes first so both collectives run on one
    contiguous buffer (gloo mishandles the strided views a concatenation's backward hands on)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, cp: int) -> torch.Tensor:
        ctx.group = group
        local = x.movedim(2, 0).contiguous()
        out = local.new_empty((cp * local.shape[0], *local.shape[1:]))
        dist.all_gather_into_tensor(out, local, group=group)
        return out.movedim(0, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        full = grad.movedim(2, 0).contiguous()
        mine = full.new_empty((full.shape[0] // dist.get_world_size(ctx.group), *full.shape[1:]))
        dist.reduce_scatter_tensor(mine, full, op=dist.ReduceOp.SUM, group=ctx.group)
        return mine.movedim(0, 2), None, None


class CausalWork:
    """Attention of this rank's queries to the group's keys and values, under the causal (and document) mask.
    Built once per forward by ContextShard.prepare and handed to every layer as its `mask`; the mask itself is
    built at the first layer that needs it: a flex BlockMask on CUDA (the rank's t queries against the T keys, in
    blocks), dense booleans [t, T] elsewhere or with attention dropout, which flex attention lacks."""

    def __init__(self, shard: ContextShard, q_pos: torch.Tensor, kv_pos: torch.Tensor,
                 document_ids: torch.Tensor | None) -> None:
        self.shard, self.q_pos, self.kv_pos, self.docs = shard, q_pos, kv_pos, document_ids
        # torch's ring attention: CUDA, plain causal only (no document mask).
        self.ring = shard.ring if document_ids is None else None
        self.masks: dict[bool, Any] = {}

    def mask(self, flex: bool) -> Any:
        if flex not in self.masks:
            self.masks[flex] = self._flex_mask() if flex else self._dense_mask()
        return self.masks[flex]

    def _dense_mask(self) -> torch.Tensor:
        q_pos, kv_pos, docs = self.q_pos, self.kv_pos, self.docs
        allowed = q_pos[:, None] >= kv_pos[None, :]  # [t, T]
        if docs is None:
            return allowed
        same = docs[:, q_pos][:, :, None] == docs[:, kv_pos][:, None, :]
        return (same & allowed).unsqueeze(1)  # [b, 1, t, T]

    def _flex_mask(self) -> Any:
        from train.model.document_mask import block_mask

        q_pos, kv_pos, docs = self.q_pos, self.kv_pos, self.docs

        def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return q_pos[q] >= kv_pos[kv]

        def within_documents(b: Any, h: Any, q: Any, kv: Any) -> Any:
            qp, kp = q_pos[q], kv_pos[kv]
            return (qp >= kp) & (docs[b, qp] == docs[b, kp])  # type: ignore[index]

        rule, batch = (causal, None) if docs is None else (within_documents, docs.shape[0])
        return block_mask(rule, batch, len(q_pos), len(kv_pos), q_pos.device, self.shard.compiled)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> torch.Tensor:
        """q: [b, heads, t_local, d]; k, v: [b, kv_heads, t_local, d] (this rank's, before any GQA repeat)."""
        if self.ring is not None and not dropout and q.dtype in RING_DTYPES:
            k, v = repeat_kv(q, k, v)
            return self.ring(q, k, v)  # type: ignore[no-any-return]
        from train.model.document_mask import masked_attention

        k, v = self.shard.gather(k), self.shard.gather(v)
        k, v = repeat_kv(q, k, v)
        flex = self.shard.flex and not dropout
        return masked_attention(q, k, v, self.mask(flex), dropout, compiled=self.shard.compiled)


class ContextShard:
    """This rank's place in its context-parallel group: which tokens of a sequence it holds, and the collectives."""

    def __init__(self, group: Any, cp: int, rank: int, mesh: Any = None, cuda: bool = False,
                 flex: bool | None = None) -> None:
        """`cuda`: torch's ring attention for plain causal attention, flex attention (compiled) for the masked
        kinds. `flex`: flex attention regardless (eager off CUDA: tests check its masks on CPU)."""
        self.group, self.cp, self.rank = group, cp, rank
        self.ring = ring_attention(mesh) if cuda else None
        self.flex, self.compiled = cuda if flex is None else flex, cuda

    def local(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's head and tail chunks of a full-sequence tensor (inputs, targets)."""
        pos = chunk_positions(x.shape[dim], self.cp, self.rank, x.device)
        return x.index_select(dim, pos)

    def target_share(self, flat_targets: torch.Tensor) -> torch.Tensor:
        """What this rank's mean loss is multiplied by so that the mean over the cp ranks (which the gradient
        average and the logged loss take) is the whole sequence's mean over its counted targets: cp x this rank's
        counted targets / the group's. Exactly 1 where every target counts; one scalar all-reduce, no host sync."""
        from train.loss import counted

        mine = counted(flat_targets).to(torch.float32)
        total = mine.clone()
        dist.all_reduce(total, group=self.group)
        return mine * self.cp / total.clamp(min=1)

    def whole_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """[b, t_local, ...] of every rank of the group -> [b, T, ...] in sequence order (no gradient)."""
        parts = x.new_empty((self.cp * x.shape[0], *x.shape[1:]))  # gloo: the ranks' tensors end to end
        dist.all_gather_into_tensor(parts, x.contiguous(), group=self.group)
        gathered = parts.view(self.cp, *x.shape).movedim(0, 1).reshape(x.shape[0], -1, *x.shape[2:])  # gathered_positions order
        whole = torch.empty_like(gathered)
        whole[:, gathered_positions(gathered.shape[1], self.cp, x.device)] = gathered
        return whole

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[b, h, t_local, d] -> [b, h, T, d] in gathered_positions order; autograd-correct (the backward returns
        each rank the sum of every rank's gradient for its keys and values)."""
        return _GatherSequence.apply(x, self.group, self.cp)  # type: ignore[no-any-return]

    def prepare(self, local_len: int, document_ids: torch.Tensor | None,
                device: torch.device) -> tuple[torch.Tensor, CausalWork]:
        """For one forward of `local_len` tokens a rank: their positions in the whole sequence ([t_local], or
        [b, t_local] counted from each document's start with `document_ids` [b, T]) and the layers' attention."""
        seq_len = local_len * self.cp
        q_pos = chunk_positions(seq_len, self.cp, self.rank, device)
        kv_pos = gathered_positions(seq_len, self.cp, device)
        work = CausalWork(self, q_pos, kv_pos, document_ids)
        if document_ids is None:
            return q_pos, work
        from train.model.document_mask import positions_in_documents

        return positions_in_documents(document_ids)[:, q_pos], work


class _CausalSDPA(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def ring_attention(mesh: Any) -> nn.Module:
    """torch's ring attention over the cp mesh (CUDA): an SDPA module whose q, k, v become sequence-sharded
    DTensors, dispatched to the ring kernels with head-tail load balancing (its default, our chunk order)."""
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _ContextParallel,
        _enable_context_parallel_dispatcher,
    )

    module = _CausalSDPA()
    _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)._apply(module, mesh)
    _enable_context_parallel_dispatcher()
    return module


def attach(model: nn.Module, shard: ContextShard) -> None:
    """Make `model` (slurmtrain's transformer) run its share of each sequence; its MoE layers (if any) reduce their
    load-balancing fraction over the cp group (train/model/moe.py)."""
    from train.model.moe import moe_layers

    model.context = shard  # type: ignore[assignment]
    for _, layer in moe_layers(model):
        layer.cp_group, layer.context = shard.group, shard
