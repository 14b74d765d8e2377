"""A small causal language model that is not slurmtrain's: gated causal convolutions instead of attention.

slurmtrain builds it from conf/model/conv_lm.yaml (`_target_: model.ConvLM`) and finds its repeated block
(`ConvBlock`, the children of `self.layers`) on its own: FSDP shards per block and activation checkpointing
recomputes per block without being told.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvBlock(nn.Module):
    """Causal depthwise convolution over time, then a gated MLP; pre-norm residuals."""

    def __init__(self, dim: int, kernel: int, hidden: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.norm1 = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, kernel, groups=dim)
        self.norm2 = nn.LayerNorm(dim)
        self.gate_up = nn.Linear(dim, 2 * hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x).transpose(1, 2)  # [batch, dim, time]
        h = self.conv(F.pad(h, (self.kernel - 1, 0)))  # left padding only: position t sees t and before
        x = x + h.transpose(1, 2)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class ConvLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 64, layers: int = 3, kernel: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(ConvBlock(dim, kernel, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (optional: slurmtrain uses it for MFU; without it, 6 x parameters)."""
        matmul = sum(p.numel() for name, p in self.named_parameters() if name.endswith("weight") and p.dim() > 1)
        return 6.0 * matmul
