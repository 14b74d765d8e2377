"""contract/rules/hf_native.py: our model keys <-> a Hugging Face config.json, checked against transformers' own
config classes (what `from_pretrained` would build), and the refusals of what either side does not represent."""

from __future__ import annotations

from typing import Any

import pytest

from contract.errors import ConfigError
from contract.rules.hf_native import family, hf_config, native_model_keys
from contract.rules.model_shape import SHAPE_KEYS

LLAMA = {"vocab_size": 300, "d_model": 64, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 96,
         "max_seq_len": 48, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm", "norm_eps": 1e-6,
         "rope_theta": 500000.0, "tie_embeddings": False}
GPT2 = {**LLAMA, "n_kv_heads": None, "position": "learned", "mlp": "gelu", "norm": "layernorm", "norm_eps": 1e-5,
        "tie_embeddings": True, "ffn_hidden": 200}


def _through_transformers(config: dict[str, Any]) -> dict[str, Any]:
    """The config.json `save_pretrained` writes for the class `config` names (every field, as transformers
    reads and fills them)."""
    from transformers import AutoConfig

    fields = dict(config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields).to_dict()  # type: ignore[no-any-return]


MIXTRAL = {**LLAMA, "moe": {"num_experts": 4, "top_k": 2, "every": 1, "shared_experts": 0, "capacity_factor": 0.0}}


@pytest.mark.parametrize("model", [LLAMA, {**LLAMA, "n_kv_heads": None, "tie_embeddings": True}, GPT2,
                                   {**GPT2, "tie_embeddings": False}, MIXTRAL],
                         ids=["llama-gqa-untied", "llama-tied", "gpt2-tied", "gpt2-untied", "mixtral"])
def test_our_keys_survive_a_hugging_face_config_and_back(model: dict[str, Any]) -> None:
    written = hf_config(model)
    assert written["architectures"] == [{"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel",
                                         "mixtral": "MixtralForCausalLM"}[family(model)]]
    back = native_model_keys(_through_transformers(written), "/d")
    wanted = {k: model[k] for k in SHAPE_KEYS if "." not in k and not (k == "rope_theta" and model["position"] != "rope")}
    assert back == wanted | ({"moe": model["moe"]} if "moe" in model else {})


def test_a_config_json_leaving_fields_out_reads_as_transformers_fills_them() -> None:
    # A hand-written config: the rest is LlamaConfig's (rms_norm_eps 1e-6, untied, 2048 positions, kv = heads).
    short = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4}
    assert native_model_keys(short, "/d") == native_model_keys(_through_transformers(short), "/d")
    assert native_model_keys(short, "/d")["norm_eps"] == 1e-6
    # transformers 4's rope_theta, and GPT-2's early n_ctx.
    assert native_model_keys({**short, "rope_theta": 5e5}, "/d")["rope_theta"] == 5e5
    early = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_ctx": 32, "vocab_size": 256}
    assert native_model_keys(early, "/d")["max_seq_len"] == 32
    assert native_model_keys(early, "/d")["ffn_hidden"] == 256  # n_inner null: 4 x n_embd


@pytest.mark.parametrize("config, words", [
    ({"model_type": "gpt_neox"}, "is a gpt_neox model (config.json), which slurmtrain's own transformer does not "
                                 "represent"),
    ({"model_type": "llama", "attention_bias": True}, "with attention_bias=true (biases)"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "with hidden_act=gelu"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "RoPE scaling llama3"),
    ({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}}, "RoPE scaling linear"),
    ({"model_type": "llama", "head_dim": 8, "hidden_size": 64, "num_attention_heads": 4}, "head_dim=8"),
    ({"model_type": "gpt2", "activation_function": "gelu"}, "activation_function=gelu"),
    ({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=true"),
])
def test_what_our_transformer_does_not_compute_points_at_hf_causal_lm(config: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match="model=hf_causal_lm model.config_path=/saved") as err:
        native_model_keys(config, "/saved")
    assert words in str(err.value) and str(err.value).startswith("model.init_from=/saved is a ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("changes, words", [
    ({"mlp": "gelu"}, "model.position=rope with model.mlp=gelu and model.norm=rmsnorm"),
    ({"norm": "layernorm"}, "model.norm=layernorm"),
    ({"position": "learned", "mlp": "gelu", "norm": "layernorm", "n_kv_heads": 2}, "model.n_kv_heads=2"),
    ({"_target_": "my.Net"}, "model._target_=my.Net is not slurmtrain's own transformer"),
])
def test_what_no_hugging_face_class_reproduces_is_refused_naming_it(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        hf_config({**LLAMA, **changes})
    assert words in str(err.value)
