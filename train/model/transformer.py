"""One decoder-only transformer, sized by conf/model presets (GPT-2 and Llama 3 families)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from train.model.document_mask import attention_mask, masked_attention, positions_in_documents
from train.model.mlp import MLP
from train.model.moe import MoE, is_moe_layer, moe_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under autocast, return in the input dtype.
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def make_norm(cfg: Any) -> nn.Module:
    # A config.yaml written before model.norm_eps existed (launcher.sample and export read it as saved) had 1e-5.
    eps = float(getattr(cfg, "norm_eps", 1e-5))
    return RMSNorm(cfg.d_model, eps) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model, eps=eps)


ROPE_CHUNK = 1 << 16  # positions whose angles exist at once while the tables are built


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's cos and sin, (seq_len, head_dim / 2) fp32 each, filled a chunk of positions at a time: building them
    holds the two tables and the positions, not a third table of angles (a model.max_seq_len of 1e8 made that peak
    at 1.5 times the tables). The values are those of the whole outer product."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    positions = torch.arange(seq_len, dtype=torch.float32)
    cos = torch.empty(seq_len, inv_freq.numel())
    sin = torch.empty_like(cos)
    for start in range(0, seq_len, ROPE_CHUNK):
        angles = torch.outer(positions[start:start + ROPE_CHUNK], inv_freq)
        torch.cos(angles, out=cos[start:start + ROPE_CHUNK])
        torch.sin(angles, out=sin[start:start + ROPE_CHUNK])
    return cos, sin


class KVCache:
    """Generation's key/value cache (train/model/sample.py): each layer's keys and values of the positions seen so far,
    in buffers of `max_len` positions allocated at a layer's first call, so a new token attends to them without
    recomputing them. `length`: positions held; the model advances it once a forward has passed every layer."""

    def __init__(self, max_len: int) -> None:
        self.max_len, self.length = max_len, 0
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)

    def check_room(self, new: int) -> None:
        if self.length + new > self.max_len:
            raise ValueError(f"the key/value cache holds {self.max_len} positions and {self.length + new} were asked "
                             "for")

    def update(self, index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys and values ([batch, heads, new, head_dim]); all of the layer's so far."""
        end = self.length + k.shape[2]
        if index not in self.layers:
            shape = (k.shape[0], k.shape[1], self.max_len, k.shape[3])
            self.layers[index] = (k.new_zeros(shape), v.new_zeros(shape))
        keys, values = self.layers[index]
        keys[:, :, self.length:end], values[:, :, self.length:end] = k, v
        return keys[:, :, :end], values[:, :, :end]


class LayerCache:
    """One layer's view of a KVCache, handed to its attention."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def start(self) -> int:
        return self.cache.length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(self.index, k, v)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; rotate pairs (even, odd) by the position's angle. The tables: [positions,
    # head_dim / 2] from this call's first position on, or [batch, 1, seq, head_dim / 2] (each token's own position,
    # data.document_mask).
    x1, x2 = x[..., 0::2], x[..., 1::2]
    if cos.dim() == 2:
        cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2)


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: each key/value head repeated for the query heads that share it."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return k, v


class Attention(nn.Module):
    """Separate q, k, v projections: tensor parallelism splits each by heads (a fused kv would split into k on one
    rank and v on the other). `n_heads` and `n_kv_heads` are this rank's heads."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, self.n_heads * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                cache: LayerCache | None = None, mask: Any = None) -> torch.Tensor:
        """`rope`: the tables from this call's first position on. `cache` (generation): the new positions attend to
        the cached ones too, and their keys and values join the cache. `mask` (data.document_mask): attention
        within documents (train/model/document_mask.py), a keyword so tensor parallelism's input plan passes it."""
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        seen, causal = None, True
        if cache is not None:
            start = cache.start
            k, v = cache.update(k, v)
            if start and t > 1:  # new positions after cached ones: each sees the cache and the new ones up to itself
                seen = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
            causal = not start
        dropout = self.dropout if self.training else 0.0
        attend = getattr(mask, "attend", None)
        if attend is not None:  # context parallelism: the group's keys and values (before the GQA repeat)
            return self.out(attend(q, k, v, dropout).transpose(1, 2).reshape(b, t, -1))
        k, v = repeat_kv(q, k, v)
        if mask is not None:
            y = masked_attention(q, k, v, mask, dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, is_causal=causal and seen is None,
                                               dropout_p=dropout)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: Any, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(cfg)
        # model.moe: a mixture of experts in place of the MLP in every moe.every-th layer (train/model/moe.py).
        self.mlp: nn.Module = MoE(cfg) if is_moe_layer(moe_config(cfg), layer) else MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                cache: LayerCache | None = None, mask: Any = None) -> torch.Tensor:
        # Training calls attention with (x, rope) only: tensor parallelism's input plan lists those two (a document
        # mask goes as a keyword, which the plan leaves alone).
        if cache is not None:
            attended = self.attn(self.attn_norm(x), rope, cache)
        else:
            attended = self.attn(self.attn_norm(x), rope) if mask is None else self.attn(self.attn_norm(x), rope,
                                                                                         mask=mask)
        x = x + attended
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Blocks in a ModuleDict keyed by layer number: the same names as a list ("blocks.3"), and a pipeline stage
    that keeps only its own layers keeps their names, so checkpoints load across layouts. A stage without the
    first layer has no embedding (its input is the previous stage's hidden state); one without the last has no
    final norm and output layer."""

    # The block class, declared as Hugging Face models do (train/model/blocks.py reads it): a pipeline stage may hold one.
    _no_split_modules = ["Block"]

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.position == "learned" else None
        self.blocks = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.n_layers)})
        self.final_norm: nn.Module | None = make_norm(cfg)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # trainer.loss_impl=fused (train/model/fused_head.py attach): the loss computed with the output layer.
        self.head_loss: Any = None
        if cfg.position == "rope":
            cos, sin = rope_tables(cfg.max_seq_len, cfg.d_model // cfg.n_heads, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        # Residual projections scaled by depth (GPT-2), so deep presets start with a sane activation scale.
        residual_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            is_residual = name.endswith(("out.weight", "down.weight", "experts.down"))
            nn.init.normal_(p, mean=0.0, std=residual_std if is_residual else std)

    def keep_layers(self, layers: Collection[int]) -> None:
        """Make this model a pipeline rank's part: only `layers` (one stage's, or several with an interleaved
        schedule), and the embedding / output layer if it has the first / last layer."""
        for key in [k for k in self.blocks if int(k) not in layers]:
            del self.blocks[key]
        if 0 not in layers:
            self.embed = None
            self.pos_embed = None
        if self.cfg.n_layers - 1 not in layers:
            self.final_norm = None
            self.lm_head = None

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None,
                document_ids: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> Any:
        """Logits (a later pipeline stage's input and output: hidden states). With a `cache` (generation, one
        process): `tokens` are the positions after the cached ones, and their keys and values join it. With
        `document_ids` ([batch, seq], data.document_mask; every pipeline stage gets them): attention within each
        document and positions from each document's start (train/model/document_mask.py). With a `context`
        (parallel.cp, train/strategies/context_parallel.py): `tokens` are this rank's chunks of each sequence,
        `document_ids` the whole sequence's, and the logits are its chunks'. With `targets` and a fused loss
        (trainer.loss_impl=fused): no logits, the loss's (total, cross-entropy, z-loss) instead."""
        start, positions, mask = 0, None, None
        if cache is not None:
            cache.check_room(tokens.shape[1])
            start = cache.length
        context = getattr(self, "context", None)  # parallel.cp: `tokens` are this rank's share of each sequence
        if context is not None and cache is None:
            positions, mask = context.prepare(tokens.shape[1], document_ids, tokens.device)
        elif document_ids is not None:
            if cache is not None:
                raise ValueError("document_ids and a key/value cache together: generation runs one document")
            positions, mask = positions_in_documents(document_ids), attention_mask(document_ids)
        if self.embed is not None:
            x = self.embed(tokens)
            if self.pos_embed is not None:
                x = x + self.pos_embed(torch.arange(start, start + tokens.shape[1], device=tokens.device)
                                       if positions is None else positions)
        else:
            x = tokens  # a later pipeline stage: the previous stage's hidden state
        rope = (self.rope_cos[start:], self.rope_sin[start:]) if self.cfg.position == "rope" else None  # type: ignore[index]
        if rope is not None and positions is not None:  # each token's own position: [t] or [b, 1, t] tables
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # type: ignore[index]
            rope = (cos, sin) if positions.dim() == 1 else (cos.unsqueeze(1), sin.unsqueeze(1))
        for index, block in enumerate(self.blocks.values()):
            if cache is not None:
                x = block(x, rope, cache.layer(index))
            else:
                x = block(x, rope) if mask is None else block(x, rope, mask=mask)
        if cache is not None:
            cache.length += tokens.shape[1]
        if self.lm_head is None:
            return x
        assert self.final_norm is not None
        if targets is not None and self.head_loss is not None:
            return self.head_loss(self.final_norm(x), self.lm_head.weight, targets)
        return self.lm_head(self.final_norm(x))


def build_model(model_cfg: Any) -> Transformer:
    return Transformer(model_cfg)
