"""The shape keys of slurmtrain's own transformer: the model.* keys that change its parameters' shapes or what it
computes, so that weights trained with one value are another model under another. `model.init_from` brings them with
the weights (launcher/plan/init_shape.py). Not shape keys: dropout (a training setting), init_std (the weights are
loaded), the build keys (_target_, args, block, config_path), name (a label) and init_from itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHAPE_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len", "position",
              "mlp", "norm", "norm_eps", "rope_theta", "tie_embeddings", "moe.num_experts", "moe.top_k", "moe.every",
              "moe.shared_experts")
# What a config.yaml written before a key existed trained with (contract/config/training.py's default then); a
# Hugging Face Llama or GPT-2 is dense.
OLD_DEFAULTS = {"norm_eps": 1e-5, "moe.num_experts": 0}


def value_of(model: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """model[key], a dotted key ("moe.top_k") through the nested sections."""
    node: Any = model
    for part in key.split("."):
        if not hasattr(node, "get") or node.get(part) is None:
            return default
        node = node.get(part)
    return node


def has(model: Mapping[str, Any], key: str) -> bool:
    return value_of(model, key) is not None


def matters(key: str, model: Mapping[str, Any]) -> bool:
    """Whether weights trained under another value of `key` compute something else in this model. RoPE's
    max_seq_len is only how long the rotation table is (a longer context is no other model: the weights have no
    positions); a learned position table has that many rows. rope_theta means nothing without RoPE."""
    if key == "max_seq_len":
        return model.get("position") == "learned"
    if key == "rope_theta":
        return model.get("position") == "rope"
    if key.startswith("moe.") and key != "moe.num_experts":  # the routing of a model with experts only
        return bool(value_of(model, "moe.num_experts", 0))
    return True


def effective(key: str, model: Mapping[str, Any]) -> Any:
    """The value `key` has in the model built: n_kv_heads unset is one per query head; a number compared as one."""
    value = value_of(model, key, OLD_DEFAULTS.get(key))
    if key == "n_kv_heads" and value is None:
        return model.get("n_heads")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def differing(ours: Mapping[str, Any], source: Mapping[str, Any], keys: tuple[str, ...] = SHAPE_KEYS) -> list[str]:
    """The keys of `keys` whose values would build another model from `source`'s weights."""
    return [k for k in keys if (has(source, k) or k in OLD_DEFAULTS) and matters(k, source) and effective(k, ours) != effective(k, source)]


def describe(model: Mapping[str, Any]) -> str:
    """The shape in a few words, for the plan: `d_model 64, 2 layers, 4 heads (2 kv), ffn 192, vocab 256, context
    64, rope theta 10000, swiglu, rmsnorm eps 1e-05, tied`."""
    kv = model.get("n_kv_heads")
    heads = f"{model['n_heads']} heads" + (f" ({kv} kv)" if kv and kv != model["n_heads"] else "")
    position = f"rope theta {model.get('rope_theta'):g}" if model.get("position") == "rope" else "learned positions"
    return (f"d_model {model['d_model']}, {model['n_layers']} layers, {heads}, ffn {model['ffn_hidden']}, vocab "
            f"{model['vocab_size']}, context {model['max_seq_len']}, {position}, {model.get('mlp')}, "
            f"{model.get('norm')} eps {effective('norm_eps', model):g}, "
            f"{'tied' if model.get('tie_embeddings') else 'untied'}{_experts(model)}")


def _experts(model: Mapping[str, Any]) -> str:
    experts = value_of(model, "moe.num_experts", 0)
    return f", {experts} experts top {value_of(model, 'moe.top_k')}" if experts else ""
