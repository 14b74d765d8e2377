"""The architecture comes with the weights (launcher/plan/init_shape.py): with model.init_from of a run, a checkpoint
or a Hugging Face directory, the shape keys are the source's; a typed key or a typed model group that disagrees is
refused naming both values (one `error:` line, exit 2, nothing created); model=hf_causal_lm's context defaults to
its config's position limit. Sources are written by hand here (a checkpoint's marker, its config.yaml): the shape is
read before any weight is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rules.hf_config import apply_hf_config
from contract.rundir import ckpt_layout as layout
from launcher.checks.overrides import typed_as
from launcher.compose import compose_config
from launcher.plan.init_from import normalize
from launcher.plan.init_shape import settle_shape
from tests.conftest import hq, launch

# A shape unlike tiny's in every key (GQA, untied, another eps and theta).
SHAPE = ["model.vocab_size=300", "model.d_model=32", "model.n_layers=1", "model.n_heads=4", "model.n_kv_heads=2",
         "model.ffn_hidden=48", "model.max_seq_len=40", "model.norm_eps=1e-6", "model.rope_theta=500.0",
         "model.tie_embeddings=false"]
WANTED = {"vocab_size": 300, "d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48,
          "max_seq_len": 40, "norm_eps": 1e-6, "rope_theta": 500.0, "tie_embeddings": False, "position": "rope",
          "mlp": "swiglu", "norm": "rmsnorm"}
GPT2_SHAPE = ["model=gpt2_124m", "model.vocab_size=256", "model.d_model=32", "model.n_layers=1", "model.n_heads=4",
              "model.ffn_hidden=64", "model.max_seq_len=24"]


def fake_run(root: Path, *overrides: str, step: int = 2, step_config: bool = True, drop: str = "") -> Path:
    """A run directory as training leaves it, as far as the launch reads it: config.yaml, and one complete DCP
    checkpoint (its marker, its metadata file, its own config.yaml)."""
    cfg = compose_config(list(overrides))
    text = OmegaConf.to_yaml(cfg, resolve=True)
    if drop:  # a config.yaml written before a key existed
        saved = OmegaConf.create(text)
        del saved.model[drop]
        text = OmegaConf.to_yaml(saved)
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(text)
    folder = layout.step_dir(root, step)
    (folder / "model_optim").mkdir(parents=True)
    (folder / "model_optim" / ".metadata").write_bytes(b"")
    if step_config:
        (folder / "config.yaml").write_text(text)
    layout.write_marker(folder, step=step)
    return root


def hf_dir(root: Path, config: dict[str, Any]) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # an empty, valid header
    return root


def settle(*overrides: str) -> tuple[DictConfig, tuple[str, ...]]:
    """What make_plan does to the model before anything reads it, with `overrides` typed on the command line."""
    cfg = compose_config(list(overrides))
    with typed_as(overrides):
        normalize(cfg)
        return cfg, settle_shape(cfg)


def shape(cfg: DictConfig) -> dict[str, Any]:
    return {k: cfg.model[k] for k in WANTED}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shape sources")
    return {"run": fake_run(root / "base run", *SHAPE),
            "gpt2": fake_run(root / "gpt2 run", *GPT2_SHAPE),
            "old": fake_run(root / "old run", *SHAPE, drop="norm_eps"),
            "no_step_config": fake_run(root / "copied", *SHAPE, step_config=False),
            "hf_run": fake_run(root / "hf run", "model=hf_causal_lm",
                               f"model.config_path={hq(Path(__file__).parents[1] / 'fixtures' / 'tiny_llama')}"),
            "llama": hf_dir(root / "llama", {
                "model_type": "llama", "vocab_size": 320, "hidden_size": 48, "intermediate_size": 80,
                "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
                "max_position_embeddings": 128, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}),
            "gpt2_hf": hf_dir(root / "gpt2 hf", {"model_type": "gpt2", "vocab_size": 320, "n_embd": 48, "n_layer": 2,
                                                  "n_head": 6, "n_positions": 32}),
            "neox": hf_dir(root / "neox", {"model_type": "gpt_neox", "vocab_size": 320, "hidden_size": 48}),
            "bare": hf_dir(root / "bare", {"not": "a Hugging Face config"})}


# -- where the shape comes from ----------------------------------------------------------------------------------
def test_a_run_brings_its_shape_and_its_name(sources: dict[str, Path]) -> None:
    cfg, lines = settle(f"model.init_from={hq(sources['run'])}")
    assert shape(cfg) == WANTED and cfg.model.name == "tiny"
    step = layout.step_dir(sources["run"], 2)
    assert lines == (f"shape: from {step / 'config.yaml'} (d_model 32, 1 layers, 4 heads (2 kv), ffn 48, vocab 300, "
                     "context 40, rope theta 500, swiglu, rmsnorm eps 1e-06, untied)",)
    # data.seq_len follows the context it interpolates.
    assert cfg.data.seq_len == 40


def test_a_checkpoint_brings_its_own_config_else_its_runs(sources: dict[str, Path]) -> None:
    cfg, lines = settle(f"model.init_from={hq(layout.step_dir(sources['run'], 2))}")
    assert shape(cfg) == WANTED and lines[0].startswith(f"shape: from {layout.step_dir(sources['run'], 2)}/config")
    cfg, lines = settle(f"model.init_from={hq(sources['no_step_config'])}")
    assert shape(cfg) == WANTED and lines[0].startswith(f"shape: from {sources['no_step_config']}/config.yaml (")


def test_another_family_comes_whole_with_its_group_name(sources: dict[str, Path]) -> None:
    cfg, _ = settle(f"model.init_from={hq(sources['gpt2'])}")
    assert (cfg.model.name, cfg.model.position, cfg.model.mlp, cfg.model.norm, cfg.model.d_model,
            cfg.model.max_seq_len, cfg.model.vocab_size) == ("gpt2_124m", "learned", "gelu", "layernorm", 32, 24, 256)


def test_a_config_yaml_from_before_norm_eps_trained_with_1e5(sources: dict[str, Path]) -> None:
    cfg, _ = settle(f"model.init_from={hq(sources['old'])}")
    assert (cfg.model.norm_eps, cfg.model.d_model) == (1e-5, 32)
    with pytest.raises(ConfigError, match=r"^model.norm_eps=1e-6 disagrees with .* model.norm_eps=1e-05 \("):
        settle(f"model.init_from={hq(sources['old'])}", "model.norm_eps=1e-6")


def test_hugging_face_configs_map_onto_our_keys(sources: dict[str, Path]) -> None:
    cfg, lines = settle(f"model.init_from={hq(sources['llama'])}")
    assert shape(cfg) == {"vocab_size": 320, "d_model": 48, "n_layers": 3, "n_heads": 6, "n_kv_heads": 2,
                          "ffn_hidden": 80, "max_seq_len": 128, "norm_eps": 1e-6, "rope_theta": 5e5,
                          "tie_embeddings": False, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm"}
    assert cfg.model.name == "llama" and lines[0].startswith(f"shape: from {sources['llama']}/config.json (d_model 48")
    cfg, _ = settle(f"model.init_from={hq(sources['gpt2_hf'])}")
    assert (cfg.model.position, cfg.model.mlp, cfg.model.norm, cfg.model.ffn_hidden, cfg.model.max_seq_len,
            cfg.model.tie_embeddings, cfg.model.name) == ("learned", "gelu", "layernorm", 192, 32, True, "gpt2")


def test_weights_without_a_config_keep_the_composed_shape_and_say_so(sources: dict[str, Path]) -> None:
    cfg, lines = settle(f"model.init_from={hq(sources['bare'] / 'model.safetensors')}")
    assert cfg.model.d_model == 64 and lines == (
        f"shape: model=tiny as composed ({sources['bare'] / 'model.safetensors'} carries no config of its shape; the "
        "weights are compared with it at launch)",)


def test_a_hugging_face_model_ours_does_not_compute_points_at_hf_causal_lm(sources: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=f"is a gpt_neox model .*: train it as it is with model=hf_causal_lm "
                                          f"model.config_path={sources['neox']}$"):
        settle(f"model.init_from={hq(sources['neox'])}")


# -- what the command line types ---------------------------------------------------------------------------------
def test_a_typed_key_that_agrees_is_kept_and_one_that_disagrees_names_both_values(sources: dict[str, Path]) -> None:
    cfg, _ = settle(f"model.init_from={hq(sources['run'])}", "model.d_model=32", "model.n_kv_heads=2")
    assert shape(cfg) == WANTED
    with pytest.raises(ConfigError) as err:
        settle(f"model.init_from={hq(sources['run'])}", "model.d_model=48", "model.ffn_hidden=48", "model.norm_eps=1e-5")
    assert str(err.value) == (
        f"model.d_model=48 model.norm_eps=1e-5 disagree with model.init_from={sources['run']}: its weights were "
        f"trained with model.d_model=32 model.norm_eps=1e-06 ({layout.step_dir(sources['run'], 2)}/config.yaml): "
        "drop model.d_model=48 model.norm_eps=1e-5 (the shape comes with the weights), or point model.init_from at "
        "weights of that shape")


@pytest.mark.parametrize("typed", ["model.n_kv_heads=4", "model.tie_embeddings=true", "model.rope_theta=10000",
                                   "model.vocab_size=256", "model.n_layers=2", "model.norm=layernorm"])
def test_every_shape_key_typed_otherwise_is_refused(sources: dict[str, Path], typed: str) -> None:
    with pytest.raises(ConfigError, match=f"^{typed} disagrees with model.init_from="):
        settle(f"model.init_from={hq(sources['run'])}", typed)


def test_a_typed_group_is_a_typed_shape(sources: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as err:
        settle("model=gpt2_124m", f"model.init_from={hq(sources['run'])}")
    assert str(err.value).startswith(
        "model=gpt2_124m (its model.vocab_size=50304 model.d_model=768 model.n_layers=12 model.n_heads=12 and 8 more) "
        f"disagrees with model.init_from={sources['run']}: its weights were trained with model.vocab_size=300 "
        "model.d_model=32 model.n_layers=1 model.n_heads=4 and 8 more (")
    assert "drop model=gpt2_124m (the shape comes with the weights)" in str(err.value)
    # The group's keys typed to the source's shape: the group agrees, and names the model.
    cfg, lines = settle("model=gpt2_124m", *GPT2_SHAPE[1:], f"model.init_from={hq(sources['gpt2'])}")
    assert cfg.model.name == "gpt2_124m" and lines[0].startswith(
        f"shape: model=gpt2_124m, as {layout.step_dir(sources['gpt2'], 2)}/config.yaml has it (d_model 32")


def test_a_longer_rope_context_is_no_other_shape_a_learned_table_is(sources: dict[str, Path]) -> None:
    cfg, lines = settle(f"model.init_from={hq(sources['run'])}", "model.max_seq_len=80")
    assert cfg.model.max_seq_len == 80 and cfg.data.seq_len == 80
    assert lines[0].endswith("; context 80 as typed (the weights were trained at 40)")
    with pytest.raises(ConfigError, match="^model.max_seq_len=80 disagrees with .* model.max_seq_len=24 "):
        settle(f"model.init_from={hq(sources['gpt2'])}", "model.max_seq_len=80")


def test_a_resumed_run_takes_its_own_config_and_not_the_gone_source(sources: dict[str, Path], tmp_path: Path) -> None:
    fake_run(tmp_path / "runs" / "tuned", *SHAPE)
    gone = tmp_path / "moved away"
    args = (f"model.init_from={hq(gone)}", f"run.root={hq(tmp_path / 'runs')}", "run.name=tuned")
    cfg, lines = settle(*args)
    assert shape(cfg) == WANTED and lines[0].startswith("shape: from the run's own config.yaml, which it resumes (")
    with pytest.raises(ConfigError, match="the run's own config.yaml, which it resumes"):
        settle(*args, "model.d_model=64")
    with pytest.raises(ConfigError, match="does not exist"):  # starting over reads the source: it must be there
        settle(*args, "run.overwrite=true")
    # A derived run name hashes the shape: without the source, only a named run is found.
    with pytest.raises(ConfigError, match=r"does not exist: point it at .*; to resume a run started from it, name "
                                          r"that run \(run.name=NAME\): its own config.yaml then gives the shape$"):
        settle(*args[:2])


# -- models built by their own code ------------------------------------------------------------------------------
def test_hf_causal_lm_takes_its_config_from_the_weights(sources: dict[str, Path]) -> None:
    cfg, lines = settle("model=hf_causal_lm", f"model.init_from={hq(sources['llama'])}")
    assert cfg.model.config_path == str(sources["llama"] / "config.json")
    assert lines == (f"shape: model.config_path={sources['llama'] / 'config.json'} (from model.init_from's "
                     "config.json)",)
    # A run of one, with no model chosen, brings its whole build.
    cfg, _ = settle(f"model.init_from={hq(sources['hf_run'])}")
    assert (cfg.model.name, cfg.model._target_) == ("hf_causal_lm", "train.model.hf.causal_lm")
    assert cfg.model.config_path == str(Path(__file__).parents[1] / "fixtures" / "tiny_llama")


def _hf(*overrides: str) -> DictConfig:
    cfg = compose_config(list(overrides))
    typed = [k for k in ("vocab_size", "max_seq_len") if any(o.startswith(f"model.{k}=") for o in overrides)]
    apply_hf_config(cfg, typed)
    return cfg


def test_hf_causal_lm_context_defaults_to_the_position_limit(sources: dict[str, Path]) -> None:
    llama = f"model.config_path={hq(sources['llama'])}"
    cfg = _hf("model=hf_causal_lm", llama)
    assert (cfg.model.max_seq_len, cfg.data.seq_len, cfg.model.vocab_size) == (128, 128, 320)
    assert _hf("model=hf_causal_lm", llama, "model.max_seq_len=16").data.seq_len == 16
    assert _hf("model=hf_causal_lm", f"model.config_path={hq(sources['gpt2_hf'])}").model.max_seq_len == 32
    with pytest.raises(ConfigError, match=r"^model.max_seq_len=200 exceeds max_position_embeddings=128 of .*: set "
                                          r"model.max_seq_len<=128, or drop it \(it defaults to 128\)$"):
        _hf("model=hf_causal_lm", llama, "model.max_seq_len=200")
    with pytest.raises(ConfigError, match=r"^data.seq_len=64 exceeds n_positions=32 of "):
        _hf("model=hf_causal_lm", f"model.config_path={hq(sources['gpt2_hf'])}", "data.seq_len=64")
    with pytest.raises(ConfigError, match=r"^model.vocab_size=256 disagrees with vocab_size=320 of .*: drop "
                                          r"model.vocab_size \(model=hf_causal_lm takes its config's\)$"):
        _hf("model=hf_causal_lm", llama, "model.vocab_size=256")


# -- as a user sees it -------------------------------------------------------------------------------------------
def test_a_disagreeing_key_is_one_error_line_exit_2_and_nothing_created(sources: dict[str, Path],
                                                                       run_root: Path) -> None:
    before = sorted(sources["run"].rglob("*"))
    out = launch(f"model.init_from={hq(sources['run'])}", "model.d_model=48", f"run.root={hq(run_root)}",
                 "run.name=tuned", "trainer.max_steps=2")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert out.stderr.splitlines() == [
        f"error: model.d_model=48 disagrees with model.init_from={sources['run']}: its weights were trained with "
        f"model.d_model=32 ({layout.step_dir(sources['run'], 2)}/config.yaml): drop model.d_model=48 (the shape "
        "comes with the weights), or point model.init_from at weights of that shape"]
    assert list(run_root.iterdir()) == [] and sorted(sources["run"].rglob("*")) == before
    # A sweep: the point that disagrees stops the whole sweep before any point runs.
    out = launch("-m", "model.d_model=32,48", f"model.init_from={hq(sources['run'])}", f"run.root={hq(run_root)}",
                 "trainer.max_steps=2")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert out.stderr.splitlines()[-1].startswith("error: sweep point 1 (model.d_model=48): model.d_model=48 "
                                                  "disagrees with model.init_from=")
    assert not list(run_root.rglob("config.yaml"))


def test_a_group_typed_after_its_keys_is_still_the_choice() -> None:
    from launcher.checks.group_names import settle_names

    cfg = compose_config(["model.d_model=32", "model=gpt2_124m", "model.name=gpt2_124m"])
    with typed_as(["model.d_model=32", "model=gpt2_124m", "model.name=gpt2_124m"]), pytest.raises(
            ConfigError, match="^model.name=gpt2_124m is what model=gpt2_124m sets already"):
        settle_names(cfg)
