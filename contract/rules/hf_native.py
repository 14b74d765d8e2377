"""slurmtrain's own transformer and a Hugging Face config.json: one mapping, both ways, without torch or transformers.

Two families: Llama (RoPE, SwiGLU, RMSNorm: `LlamaForCausalLM`) and GPT-2 (learned positions, GELU's tanh
approximation, LayerNorm: `GPT2LMHeadModel`). `native_model_keys` reads a config.json into our model keys (the
launch: model.init_from=DIR's shape; the ranks: the weight adapter), `hf_config` writes one from them (export). Each
refuses in one line what the other side does not represent exactly. A field a config.json leaves out has the value
transformers' class gives it. The weights' names and layouts (the RoPE permutation) are the adapters' (train/weights/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.errors import ConfigError
from contract.rules.model_shape import value_of

# What LlamaConfig and GPT2Config give a field a config.json leaves out (transformers 5; a hand-written or old file
# may omit any of them).
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rope_theta": 10000.0, "head_dim": None}
GPT2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}
# MixtralConfig's (transformers 5): a Llama's fields with its own defaults, and the experts'.
MIXTRAL_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": None}
# GELU's tanh approximation, as the native MLP computes it, under each name transformers knows it by.
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
FAMILIES = {"llama": ("rope", "swiglu", "rmsnorm"), "gpt2": ("learned", "gelu", "layernorm")}


def _rope(config: Mapping[str, Any]) -> tuple[float, str]:
    """(theta, rope type) from transformers 5's rope_parameters or 4's rope_theta and rope_scaling."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        return float(params.get("rope_theta", LLAMA_DEFAULTS["rope_theta"])), str(params.get("rope_type", "default"))
    scaling = config.get("rope_scaling")
    kind = str(scaling.get("rope_type", scaling.get("type", "default"))) if isinstance(scaling, Mapping) else "default"
    return float(config.get("rope_theta", LLAMA_DEFAULTS["rope_theta"])), kind


def _llama_keys(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    heads, d_model = int(c["num_attention_heads"]), int(c["hidden_size"])
    theta, rope_type = _rope(c)
    odd = [f"hidden_act={c['hidden_act']} (the native MLP is SwiGLU: silu)"] if c["hidden_act"] != "silu" else []
    odd += [f"{k}=true (biases)" for k in ("attention_bias", "mlp_bias") if c[k]]
    if rope_type != "default":
        odd.append(f"RoPE scaling {rope_type}")
    if c["head_dim"] is not None and int(c["head_dim"]) * heads != d_model:
        odd.append(f"head_dim={c['head_dim']} (the native model's is hidden_size / num_attention_heads)")
    kv = c["num_key_value_heads"]
    return {"vocab_size": int(c["vocab_size"]), "d_model": d_model, "n_layers": int(c["num_hidden_layers"]),
            "n_heads": heads, "n_kv_heads": None if kv is None or int(kv) == heads else int(kv),
            "ffn_hidden": int(c["intermediate_size"]), "max_seq_len": int(c["max_position_embeddings"]),
            "position": "rope", "mlp": "swiglu", "norm": "rmsnorm", "norm_eps": float(c["rms_norm_eps"]),
            "rope_theta": theta, "tie_embeddings": bool(c["tie_word_embeddings"])}, odd


def _mixtral_keys(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    keys, odd = _llama_keys(c)
    odd += [f"{k}={c[k]}" for k in ("sliding_window",) if c[k] is not None]
    if float(c["router_jitter_noise"]):
        odd.append(f"router_jitter_noise={c['router_jitter_noise']}")
    keys["moe"] = {"num_experts": int(c["num_local_experts"]), "top_k": int(c["num_experts_per_tok"]), "every": 1,
                   "shared_experts": 0, "capacity_factor": 0.0}
    return keys, odd


def _gpt2_keys(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    d_model = int(c["n_embd"])
    odd = [] if c["activation_function"] in TANH_GELU else [
        f"activation_function={c['activation_function']} (the native MLP is GELU's tanh approximation, gelu_new)"]
    odd += [f"{k}={str(c[k]).lower()}" for k in ("scale_attn_by_inverse_layer_idx", "add_cross_attention") if c[k]]
    if not c["scale_attn_weights"]:
        odd.append("scale_attn_weights=false")
    return {"vocab_size": int(c["vocab_size"]), "d_model": d_model, "n_layers": int(c["n_layer"]),
            "n_heads": int(c["n_head"]), "n_kv_heads": None, "ffn_hidden": int(c["n_inner"] or 4 * d_model),
            "max_seq_len": int(c["n_positions"]),
            "position": "learned", "mlp": "gelu", "norm": "layernorm", "norm_eps": float(c["layer_norm_epsilon"]),
            "tie_embeddings": bool(c["tie_word_embeddings"])}, odd


def native_model_keys(config: Mapping[str, Any], config_dir: str, key: str = "model.init_from") -> dict[str, Any]:
    """Our model keys for a Llama or GPT-2 config.json (`config_dir` holds it; `key` named it). Anything else, or a
    field the native model does not compute (biases, scaled RoPE, another activation), is one ConfigError line
    pointing at model=hf_causal_lm, which builds the Hugging Face class itself."""
    model_type = config.get("model_type")
    fix = f"train it as it is with model=hf_causal_lm model.config_path={config_dir}"
    if model_type not in (*FAMILIES, "mixtral"):
        raise ConfigError(f"{key}={config_dir} is a {model_type or 'model without model_type'} model (config.json), "
                          f"which slurmtrain's own transformer does not represent (it takes Llama, Mixtral and GPT-2): {fix}")
    defaults = {"llama": LLAMA_DEFAULTS, "mixtral": MIXTRAL_DEFAULTS}.get(str(model_type), GPT2_DEFAULTS)
    if model_type == "gpt2" and config.get("n_positions") is None and config.get("n_ctx"):
        config = {**config, "n_positions": config["n_ctx"]}  # an early GPT-2 config.json
    filled = {**defaults, **{k: v for k, v in config.items() if v is not None or k not in defaults}}
    keys, odd = {"llama": _llama_keys, "mixtral": _mixtral_keys}.get(str(model_type), _gpt2_keys)(filled)
    if odd:
        raise ConfigError(f"{key}={config_dir} is a {model_type} model with {', '.join(odd)} (config.json), which "
                          f"slurmtrain's own transformer does not compute: {fix}")
    return keys


def family(model: Mapping[str, Any]) -> str:
    """"llama", "mixtral" or "gpt2": the Hugging Face class that computes exactly what this native model does;
    ConfigError naming what differs for any other."""
    if model.get("_target_"):
        raise ConfigError(f"model._target_={model['_target_']} is not slurmtrain's own transformer: no Hugging Face "
                          "mapping of its keys")
    parts = (model.get("position", "rope"), model.get("mlp", "swiglu"), model.get("norm", "rmsnorm"))
    if value_of(model, "moe.num_experts", 0):
        return _mixtral(model, parts)
    for name, wanted in FAMILIES.items():
        if parts == wanted:
            if name == "gpt2" and model.get("n_kv_heads") not in (None, model.get("n_heads")):
                raise ConfigError(f"model.n_kv_heads={model['n_kv_heads']} (grouped-query attention) has no GPT-2 "
                                  "class in Hugging Face: GPT-2 gives every query head its own key and value")
            return name
    raise ConfigError(f"no Hugging Face class computes model.position={parts[0]} with model.mlp={parts[1]} and "
                      f"model.norm={parts[2]}: Llama is rope, swiglu, rmsnorm and GPT-2 learned, gelu, layernorm; "
                      "set one family's three")


def _mixtral(model: Mapping[str, Any], parts: tuple[str, str, str]) -> str:
    """A mixture of experts is a Mixtral when it is a Llama with experts in every layer, dropless, without shared
    experts (what MixtralForCausalLM computes)."""
    odd = [f"model.moe.{k}={value_of(model, 'moe.' + k)}" for k, plain in
           (("every", 1), ("shared_experts", 0), ("capacity_factor", 0)) if value_of(model, "moe." + k, plain) != plain]
    if parts != FAMILIES["llama"]:
        odd.append(f"model.position={parts[0]} model.mlp={parts[1]} model.norm={parts[2]}")
    if odd:
        raise ConfigError(f"a mixture of experts with {' '.join(odd)} has no Hugging Face class: MixtralForCausalLM is "
                          "rope, swiglu and rmsnorm with experts in every layer (model.moe.every=1), dropless "
                          "(capacity_factor=0) and no shared experts")
    return "mixtral"


def hf_config(model: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json (as `save_pretrained` writes one, without token ids) for our model keys: LlamaForCausalLM or
    GPT2LMHeadModel, every field written (no reader's defaults assumed)."""
    name = family(model)
    d_model, heads = int(model["d_model"]), int(model["n_heads"])
    eps = float(model.get("norm_eps", 1e-5))
    common = {"vocab_size": int(model["vocab_size"]), "tie_word_embeddings": bool(model["tie_embeddings"]),
              "initializer_range": float(model.get("init_std", 0.02))}
    if name == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **common, "n_embd": d_model,
                "n_layer": int(model["n_layers"]), "n_head": heads, "n_inner": int(model["ffn_hidden"]),
                "n_positions": int(model["max_seq_len"]), "activation_function": "gelu_new",
                "layer_norm_epsilon": eps, "attn_pdrop": float(model.get("dropout", 0.0)), "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "add_cross_attention": False}
    if name == "mixtral":
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common, "hidden_size": d_model,
                "intermediate_size": int(model["ffn_hidden"]), "num_hidden_layers": int(model["n_layers"]),
                "num_attention_heads": heads, "num_key_value_heads": int(model.get("n_kv_heads") or heads),
                "head_dim": d_model // heads, "max_position_embeddings": int(model["max_seq_len"]),
                "rms_norm_eps": eps, "rope_parameters": {"rope_theta": float(model.get("rope_theta", 10000.0)),
                                                         "rope_type": "default"},
                "hidden_act": "silu", "attention_dropout": float(model.get("dropout", 0.0)),
                "num_local_experts": int(value_of(model, "moe.num_experts")),
                "num_experts_per_tok": int(value_of(model, "moe.top_k")),
                "router_aux_loss_coef": float(value_of(model, "moe.aux_loss_coef", 0.0)),
                "router_jitter_noise": 0.0, "sliding_window": None, "output_router_logits": False}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common, "hidden_size": d_model,
            "intermediate_size": int(model["ffn_hidden"]), "num_hidden_layers": int(model["n_layers"]),
            "num_attention_heads": heads, "num_key_value_heads": int(model.get("n_kv_heads") or heads),
            "head_dim": d_model // heads, "max_position_embeddings": int(model["max_seq_len"]),
            "rms_norm_eps": eps, "rope_parameters": {"rope_theta": float(model.get("rope_theta", 10000.0)),
                                                     "rope_type": "default"},
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "attention_dropout": float(model.get("dropout", 0.0)), "pretraining_tp": 1}
