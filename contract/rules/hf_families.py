"""slurmtrain's transformer and the Hugging Face classes that compute exactly the same function, config side only
(plain values: no torch, no transformers; the tensors' mapping is train/weights/hf_adapters.py).

Two families, switched by model.position, model.mlp and model.norm:
    llama   RoPE, SwiGLU, RMSNorm (tiny, llama3_*)         <-> LlamaForCausalLM (model_type llama)
    gpt2    learned positions, GELU (tanh), LayerNorm (gpt2_*) <-> GPT2LMHeadModel (model_type gpt2)

    family(model)              which one a model config of ours is; ConfigError naming what no class reproduces
    hf_config(model, eos_id)   (model_type, the Hugging Face config's arguments) for an export
    native_keys(config, where) the model.* values a Llama or GPT-2 config.json gives our transformer; ConfigError,
                               pointing at model=hf_causal_lm, for what ours can't represent (biases in q/k/v, a
                               parallel residual, rope scaling, ...)
    disagreement(model, keys)  the first of those values a model config sets otherwise, as one clause
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.errors import ConfigError

LLAMA, GPT2 = "llama", "gpt2"
# What each family's position, MLP and norm are (model.position, model.mlp, model.norm).
LAYOUTS = {LLAMA: ("rope", "swiglu", "rmsnorm"), GPT2: ("learned", "gelu", "layernorm")}
CLASSES = {LLAMA: "LlamaForCausalLM", GPT2: "GPT2LMHeadModel"}
# Our GELU is F.gelu(approximate="tanh"): transformers' gelu_pytorch_tanh is that call; gelu_new the same formula
# written out (equal up to rounding).
GPT2_GELUS = ("gelu_pytorch_tanh", "gelu_new")
NORM_EPS = 1e-5  # model.norm_eps's default (the RMSNorm and LayerNorm epsilon)


def _value(model: Any, key: str, default: Any = None) -> Any:
    value = model.get(key, default) if isinstance(model, Mapping) or hasattr(model, "get") else getattr(model, key)
    return default if value is None else value


def kv_heads(model: Any) -> int:
    return int(_value(model, "n_kv_heads", _value(model, "n_heads")))


def family(model: Any) -> str:
    """`llama` or `gpt2`; ConfigError (one line) naming what no Hugging Face class reproduces."""
    layout = tuple(_value(model, k) for k in ("position", "mlp", "norm"))
    found = next((name for name, want in LAYOUTS.items() if want == layout), None)
    if found is None:  # named against the nearer family: what it has that the class has not
        nearest = max(LAYOUTS, key=lambda n: sum(a == b for a, b in zip(LAYOUTS[n], layout, strict=True)))
        differs = ", ".join(f"model.{k}={v} ({CLASSES[nearest]} has {want})" for k, v, want
                            in zip(("position", "mlp", "norm"), layout, LAYOUTS[nearest], strict=True) if v != want)
        raise ConfigError(f"no Hugging Face class computes this model exactly: {differs}; export it with --format "
                          "safetensors")
    d_model, heads = int(_value(model, "d_model")), int(_value(model, "n_heads"))
    if found == GPT2 and kv_heads(model) != heads:
        raise ConfigError(f"GPT2LMHeadModel has no grouped-query attention (model.n_kv_heads={kv_heads(model)} with "
                          f"model.n_heads={heads}): export it with --format safetensors")
    if found == GPT2 and d_model % heads:
        raise ConfigError(f"GPT2LMHeadModel needs model.d_model={d_model} divisible by model.n_heads={heads}: export "
                          "it with --format safetensors")
    return found


def hf_config(model: Any, eos_id: int | None) -> tuple[str, dict[str, Any]]:
    """(model_type, the arguments of its config class) that reproduce `model` exactly; the end-of-document id is
    the end of a sequence (generate() stops there). The vocabulary is the model's rows, padded ones included, so
    config.json and the weights agree."""
    name = family(model)
    m = {k: _value(model, k) for k in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden", "max_seq_len",
                                       "rope_theta", "tie_embeddings", "dropout", "init_std")}
    eps = float(_value(model, "norm_eps", NORM_EPS))
    common = {"vocab_size": int(m["vocab_size"]), "tie_word_embeddings": bool(m["tie_embeddings"]),
              "initializer_range": float(m["init_std"]), "bos_token_id": None, "eos_token_id": eos_id,
              "pad_token_id": None, "architectures": [CLASSES[name]]}
    if name == LLAMA:
        return LLAMA, {**common, "hidden_size": int(m["d_model"]), "intermediate_size": int(m["ffn_hidden"]),
                       "num_hidden_layers": int(m["n_layers"]), "num_attention_heads": int(m["n_heads"]),
                       "num_key_value_heads": kv_heads(model), "head_dim": int(m["d_model"]) // int(m["n_heads"]),
                       "hidden_act": "silu", "max_position_embeddings": int(m["max_seq_len"]), "rms_norm_eps": eps,
                       "rope_theta": float(m["rope_theta"]), "attention_bias": False, "mlp_bias": False,
                       "attention_dropout": float(m["dropout"])}
    return GPT2, {**common, "n_embd": int(m["d_model"]), "n_inner": int(m["ffn_hidden"]), "n_layer": int(m["n_layers"]),
                  "n_head": int(m["n_heads"]), "n_positions": int(m["max_seq_len"]), "layer_norm_epsilon": eps,
                  "activation_function": GPT2_GELUS[0], "attn_pdrop": float(m["dropout"]), "resid_pdrop": 0.0,
                  "embd_pdrop": 0.0, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}


def _rope(config: Mapping[str, Any]) -> tuple[float, str | None]:
    """RoPE's theta and its scaling type (None: plain RoPE), from transformers 5's rope_parameters or the older
    rope_theta and rope_scaling."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return float(theta), None if kind in (None, "default") else str(kind)


def _refuse(where: str, model_type: str, what: str) -> ConfigError:
    return ConfigError(f"{where} is a Hugging Face {model_type} model with {what}, which slurmtrain's transformer "
                       f"does not compute: train it as it is with model=hf_causal_lm model.config_path=DIR")


def native_keys(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The model.* values that make our transformer the model a Llama or GPT-2 config.json describes; `where` names
    the source in messages (model.init_from=DIR). ConfigError for any other architecture or option."""
    kind = config.get("model_type")
    if kind == LLAMA:
        theta, scaling = _rope(config)
        hidden, heads = int(config.get("hidden_size", 4096)), int(config.get("num_attention_heads", 32))
        unsupported = [
            ("biases in q/k/v/o (attention_bias=true)", bool(config.get("attention_bias"))),
            ("biases in the MLP (mlp_bias=true)", bool(config.get("mlp_bias"))),
            (f"hidden_act={config.get('hidden_act')}", config.get("hidden_act", "silu") != "silu"),
            (f"rope scaling ({scaling})", scaling is not None),
            (f"head_dim={config.get('head_dim')} (not hidden_size / num_attention_heads)",
             config.get("head_dim") not in (None, hidden // heads) or hidden % heads != 0),
        ]
        for what, present in unsupported:
            if present:
                raise _refuse(where, kind, what)
        return {"vocab_size": int(config.get("vocab_size", 32000)), "d_model": hidden,
                "n_layers": int(config.get("num_hidden_layers", 32)), "n_heads": heads,
                "n_kv_heads": int(config.get("num_key_value_heads") or heads),
                "ffn_hidden": int(config.get("intermediate_size", 11008)),
                "max_seq_len": int(config.get("max_position_embeddings", 2048)),
                "position": "rope", "mlp": "swiglu", "norm": "rmsnorm", "rope_theta": theta,
                "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
                "tie_embeddings": bool(config.get("tie_word_embeddings", False))}
    if kind == GPT2:
        unsupported = [
            (f"activation_function={config.get('activation_function')} (ours is GELU's tanh form)",
             config.get("activation_function", "gelu_new") not in GPT2_GELUS),
            ("attention scores not scaled (scale_attn_weights=false)", config.get("scale_attn_weights") is False),
            ("attention scaled by the layer's index (scale_attn_by_inverse_layer_idx=true)",
             bool(config.get("scale_attn_by_inverse_layer_idx"))),
            ("cross-attention (add_cross_attention=true)", bool(config.get("add_cross_attention"))),
        ]
        for what, present in unsupported:
            if present:
                raise _refuse(where, kind, what)
        d_model = int(config.get("n_embd", 768))
        return {"vocab_size": int(config.get("vocab_size", 50257)), "d_model": d_model,
                "n_layers": int(config.get("n_layer", 12)), "n_heads": int(config.get("n_head", 12)),
                "n_kv_heads": int(config.get("n_head", 12)), "ffn_hidden": int(config.get("n_inner") or 4 * d_model),
                "max_seq_len": int(config.get("n_positions", 1024)), "position": "learned", "mlp": "gelu",
                "norm": "layernorm", "norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
                "tie_embeddings": bool(config.get("tie_word_embeddings", True))}
    raise _refuse(where, str(kind), "an architecture other than Llama or GPT-2")


# Keys whose difference the shapes of the weights do not show (the shapes' own are named by the fit check).
_UNSEEN = {"rope_theta", "norm_eps", "tie_embeddings", "position", "mlp", "norm", "n_kv_heads", "n_heads"}


def disagreement(model: Any, keys: Mapping[str, Any], where: str) -> str | None:
    """The first key of `keys` (native_keys') that `model` sets otherwise and the weights' shapes would not reveal
    (RoPE's theta, a norm's epsilon, tied or not, the layout), as one clause naming both values; None when none."""
    for key in (k for k in keys if k in _UNSEEN):
        ours = kv_heads(model) if key == "n_kv_heads" else _value(model, key, NORM_EPS if key == "norm_eps" else None)
        if ours != keys[key] and not (isinstance(ours, float) and abs(ours - keys[key]) <= 1e-12 * abs(ours)):
            return f"{where} has {key}={keys[key]} and the model model.{key}={ours}: set model.{key}={keys[key]}"
    return None
