"""What one token costs to train: FLOPs per token of slurmtrain's transformer, from its config alone.

The launch plan (launcher/plan/estimate.py) and the ranks' telemetry (MFU, train/observe/telemetry.py) both count
with it, so the plan and the measured figures agree on what one token costs. Pure arithmetic; no torch.
"""

from __future__ import annotations

from typing import Any

from contract.rules.moe_shape import mlp_params


def matmul_params(m: Any) -> int:
    """Parameters that take part in a matrix multiply for every token (the blocks' projections and the output
    layer; not the embedding lookups or the norms)."""
    d, layers = m.d_model, m.n_layers
    head_dim = d // m.n_heads
    kv_heads = m.n_kv_heads or m.n_heads
    attn = d * d + 2 * kv_heads * head_dim * d + d * d
    # A mixture of experts counts the experts a token uses (top_k) and its router (contract/rules/moe_shape.py).
    return layers * attn + mlp_params(m, active=True) + m.vocab_size * d


def flops_per_token(m: Any, seq_len: int) -> float:
    """Training FLOPs per token (forward and backward): 6 per matmul parameter, plus attention's scores and
    weighted values, 12 x layers x d_model x sequence length (PaLM, appendix B)."""
    return 6.0 * matmul_params(m) + 12.0 * m.n_layers * m.d_model * seq_len
