"""Hugging Face weights into slurmtrain's own transformer (issue 29, items 4 and 7): native -> Hugging Face ->
native is bitwise the same for each family, tied and untied, with grouped-query attention; a bfloat16 export comes
back as the bfloat16 values. What ours does not compute (GPT-2 biases that are not zero) and a value the shapes
don't show (RoPE's theta, the norms' epsilon, tied or not) are refused in one line, at launch as on the ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rules.init_source import resolve
from launcher.compose import compose_config
from tests.conftest import hq, launch
from tests.hf_checkpoints import sharpen
from train.model.build import build_model
from train.weights.hf_export import cast, hf_form, save_model
from train.weights.init_weights import check, load_into

SMALL = ["model.vocab_size=96", "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.ffn_hidden=48",
         "model.max_seq_len=32", "data.seq_len=16"]
GPT2 = ["model.position=learned", "model.mlp=gelu", "model.norm=layernorm"]
CASES = {
    "llama gqa untied": ["model.n_kv_heads=2", "model.tie_embeddings=false", "model.rope_theta=500000",
                         "model.norm_eps=1e-6"],
    "llama gqa tied": ["model.n_kv_heads=2"],
    "llama untied": ["model.tie_embeddings=false"],
    "llama tied (tiny's layout)": [],
    "gpt2 tied": GPT2,
    "gpt2 untied": [*GPT2, "model.tie_embeddings=false", "model.norm_eps=1e-6"],
}


def _model_cfg(*overrides: str) -> Any:
    return compose_config([*SMALL, *overrides]).model


def _checked(model_cfg: Any) -> int:
    from omegaconf import OmegaConf

    answer = check({"model": OmegaConf.to_container(model_cfg, resolve=True)})
    assert "init_from_tensors" in answer, answer
    return int(answer["init_from_tensors"])


def _saved_names(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return list(f.keys())


def _saved(folder: Path, overrides: list[str], dtype: str = "float32", seed: int = 0) -> dict[str, torch.Tensor]:
    """Our model (sharpened weights) written as the export writes it, without the check; its state dict."""
    model_cfg = _model_cfg(*overrides)
    torch.manual_seed(seed)
    model = build_model(model_cfg)
    sharpen(model, seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config, hf_state = hf_form(model_cfg, state, eos_id=None)
    save_model(config, cast(hf_state, dtype), folder, "50GB")
    return state


@pytest.mark.parametrize("case", CASES)
def test_native_to_hugging_face_to_native_is_bitwise(tmp_path: Path, case: str) -> None:
    state = _saved(tmp_path / "hf", CASES[case])
    model_cfg = _model_cfg(*CASES[case], f"model.init_from={tmp_path / 'hf'}")
    counted = _checked(model_cfg)  # the launch check: names and shapes after the conversion, from the headers
    if "llama" in case:  # every saved tensor is read (a tied head is saved once)
        assert counted == len(_saved_names(tmp_path / "hf"))
    fresh = build_model(model_cfg)
    load_into(fresh, resolve(str(tmp_path / "hf")), model_cfg)
    loaded = fresh.state_dict()
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    if not model_cfg.tie_embeddings:
        assert not torch.equal(loaded["lm_head.weight"], loaded["embed.weight"])
    else:
        assert fresh.lm_head.weight is fresh.embed.weight


def test_a_bfloat16_export_comes_back_as_its_bfloat16_values(tmp_path: Path) -> None:
    state = _saved(tmp_path / "hf", CASES["llama gqa untied"], dtype="bfloat16")
    model_cfg = _model_cfg(*CASES["llama gqa untied"])
    fresh = build_model(model_cfg)
    load_into(fresh, resolve(str(tmp_path / "hf")), model_cfg)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, state[name].to(torch.bfloat16).float()), name


def test_the_tensor_count_is_what_the_directory_holds(tmp_path: Path) -> None:
    """GPT-2's c_attn is read once for q, k and v; its zero biases are read but give the model nothing."""
    _saved(tmp_path / "hf", GPT2)
    weights = [k for k in _saved_names(tmp_path / "hf") if not k.endswith(".bias") or ".ln_" in k]
    assert _checked(_model_cfg(*GPT2, f"model.init_from={tmp_path / 'hf'}")) == len(weights)


def _refused(root: Path, *overrides: str) -> str:
    before = sorted(root.rglob("*"))
    out = launch(*overrides, f"run.root={hq(root / 'runs')}", "trainer.max_steps=1")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("error: "), out.stderr
    assert sorted(root.rglob("*")) == before and not (root / "runs").exists()
    return out.stderr


def test_gpt2_biases_that_are_not_zero_are_refused_pointing_at_hf_causal_lm(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=48))
    model.save_pretrained(tmp_path / "zero")  # transformers initialises the biases to zero: it loads
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.bias[3] = 0.5
    model.save_pretrained(tmp_path / "biased")
    assert _checked(_model_cfg(*GPT2, f"model.init_from={tmp_path / 'zero'}")) > 0
    err = _refused(tmp_path, f"model.init_from={hq(tmp_path / 'biased')}", "data.seq_len=16")
    assert err == (f"error: model.init_from={tmp_path / 'biased'} holds transformer.h.1.mlp.c_fc.bias, a bias that "
                   "is not zero, which slurmtrain's transformer (Linear layers without biases) does not compute: "
                   f"train it as it is with model=hf_causal_lm model.config_path={tmp_path / 'biased'}\n")


@pytest.mark.parametrize("key, typed, saved", [
    ("rope_theta", 10000.0, 500000.0), ("norm_eps", 1e-05, 1e-06), ("tie_embeddings", True, False),
])
def test_the_ranks_refuse_a_value_the_shapes_do_not_show(tmp_path: Path, key: str, typed: Any, saved: Any) -> None:
    """The launch refuses a typed key that disagrees with config.json (launcher/plan/init_shape.py); the ranks
    compare again before loading, whatever built their config."""
    _saved(tmp_path / "hf", CASES["llama gqa untied"])
    model_cfg = _model_cfg(*CASES["llama gqa untied"])
    model_cfg[key] = typed
    with pytest.raises(ConfigError) as refused:
        load_into(build_model(model_cfg), resolve(str(tmp_path / "hf")), model_cfg)
    assert str(refused.value) == (f"model.init_from={tmp_path / 'hf'} does not fit the model: its config.json has "
                                  f"{key}={saved} and the model model.{key}={typed}: set model.{key}={saved}")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
