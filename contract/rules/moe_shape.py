"""A mixture-of-experts model's size from its config (model.moe): every parameter for memory, the active ones (a
token's top_k experts) for FLOPs and MFU. Pure arithmetic; no torch. A dense config counts as before."""

from __future__ import annotations

from typing import Any


def moe_of(m: Any) -> Any:
    """model.moe when it has experts, else None (a dense model, or a config.yaml older than the key)."""
    moe = m.get("moe") if hasattr(m, "get") else getattr(m, "moe", None)
    if moe is None:
        return None
    experts = moe.get("num_experts", 0) if hasattr(moe, "get") else getattr(moe, "num_experts", 0)
    return moe if experts else None


def moe_layer_numbers(m: Any) -> list[int]:
    """The layers whose MLP is a mixture of experts: every model.moe.every-th (layers every-1, 2 x every-1, ...)."""
    moe = moe_of(m)
    if moe is None:
        return []
    return [i for i in range(int(m.n_layers)) if (i + 1) % int(moe.every) == 0]


def dense_mlp_params(m: Any) -> int:
    return int(m.d_model) * int(m.ffn_hidden) * (3 if m.mlp == "swiglu" else 2)


def moe_mlp_params(m: Any, active: bool) -> int:
    """One MoE layer's feed-forward: its router, shared experts and experts (all of them, or a token's top_k)."""
    moe = moe_of(m)
    experts = int(moe.top_k) if active else int(moe.num_experts)
    return int(m.d_model) * int(moe.num_experts) + (experts + int(moe.shared_experts)) * dense_mlp_params(m)


def mlp_params(m: Any, active: bool = False) -> int:
    """Every layer's feed-forward together: dense MLPs, and MoE layers' (all parameters, or the active ones)."""
    moe_layers = len(moe_layer_numbers(m))
    dense = (int(m.n_layers) - moe_layers) * dense_mlp_params(m)
    return dense + (moe_layers * moe_mlp_params(m, active) if moe_layers else 0)


def expert_params(m: Any) -> int:
    """The routed experts of every MoE layer together: what expert parallelism splits over its ranks (parallel.ep)."""
    moe = moe_of(m)
    return len(moe_layer_numbers(m)) * int(moe.num_experts) * dense_mlp_params(m) if moe is not None else 0


def largest_mlp_params(m: Any) -> int:
    """The largest layer's feed-forward (an FSDP unit's share)."""
    return moe_mlp_params(m, active=False) if moe_layer_numbers(m) else dense_mlp_params(m)
