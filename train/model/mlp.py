"""The dense feed-forward of slurmtrain's transformer (train/model/transformer.py), also a mixture of experts'
shared experts (train/model/moe.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """SwiGLU (gate, up, down) or GELU (up, down); separate projections so that tensor parallelism splits each."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False) if cfg.mlp == "swiglu" else None
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))
