"""model.init_from at launch: where the path points (contract/rules/init_source.py), whether the weights fit the model
(train/weights/init_weights.py), the plan's weights line (launcher/plan/init_from.py), and a mismatch refused as a user sees it:
one `error:` line, exit 2, nothing created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file, save_model

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rules.init_source import resolve, saved_weights
from contract.rundir import ckpt_layout as layout
from launcher.compose import compose_config
from launcher.plan.init_from import weights_lines
from tests.conftest import hq, launch
from train.model.build import build_model
from train.weights.fit import first_problem
from train.weights.init_weights import check, load_into

SMALL = ["model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", "data.seq_len=16"]


def _model_cfg(*overrides: str) -> Any:
    return compose_config([*SMALL, *overrides]).model


def _stored(file: Path) -> int:
    """Tensors in a safetensors file (a tied output layer is stored once, under the embedding's name)."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return len(list(f.keys()))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Our small transformer's weights as a safetensors file (tied: the output layer stored once) and a torch
    file, and a run directory whose only checkpoint is incomplete."""
    root = tmp_path_factory.mktemp("init_from")
    torch.manual_seed(3)
    model = build_model(_model_cfg())
    save_model(model, str(root / "model.safetensors"))
    torch.save(model.state_dict(), root / "weights.pt")
    (root / "run" / "checkpoints" / "step_2" / "model_optim").mkdir(parents=True)
    return {"root": root, "file": root / "model.safetensors", "torch": root / "weights.pt", "run": root / "run"}


# -- where model.init_from points ------------------------------------------------------------------------------
def test_resolves_files_directories_runs_and_checkpoints(saved: dict[str, Path], tmp_path: Path) -> None:
    assert resolve(str(saved["file"])).files == (saved["file"],)
    assert resolve(str(saved["torch"])).files == (saved["torch"],)
    # A sharded Hugging Face layout: the files its index names, not any other safetensors file beside them.
    shards = tmp_path / "sharded"
    shards.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "adapter.safetensors"):
        save_file({"x": torch.zeros(1)}, str(shards / name))
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}))
    assert [p.name for p in resolve(str(shards)).files] == ["model-00001-of-00002.safetensors",
                                                             "model-00002-of-00002.safetensors"]
    # A run directory: its newest complete checkpoint; a checkpoint named directly: that one.
    run = tmp_path / "run"
    for step in (2, 4, 6):
        folder = layout.step_dir(run, step) / "model_optim"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"")
        if step < 6:
            layout.write_marker(folder.parent, step=step)
    newest = resolve(str(run))
    assert (newest.kind, newest.path, newest.run_dir) == ("dcp", layout.step_dir(run, 4), run)
    assert resolve(str(run / "checkpoints")).path == layout.step_dir(run, 4)
    assert resolve(str(layout.step_dir(run, 2))).path == layout.step_dir(run, 2)


@pytest.mark.parametrize("case, words", [
    ("missing", "does not exist: point it at a safetensors file"),
    ("not weights", "is not a weights file (.safetensors, .bin, .pt or .pth)"),
    ("bad safetensors", "is not a safetensors file"),
    ("empty dir", "holds no weights (no *.safetensors, no pytorch_model.bin, no checkpoints/)"),
    ("run without checkpoint", "is a run directory with no complete checkpoint yet: wait for its first checkpoint"),
    ("incomplete checkpoint", "is an incomplete checkpoint (no COMPLETE marker"),
    ("index names a missing shard", "names model-00002.safetensors, which is not there"),
])
def test_what_is_not_weights_is_one_line_naming_the_fix(saved: dict[str, Path], tmp_path: Path, case: str,
                                                        words: str) -> None:
    target = {"missing": tmp_path / "nope", "not weights": tmp_path / "config.yaml",
              "bad safetensors": tmp_path / "x.safetensors", "empty dir": tmp_path / "empty",
              "run without checkpoint": saved["run"],
              "incomplete checkpoint": saved["run"] / "checkpoints" / "step_2",
              "index names a missing shard": tmp_path / "sharded"}[case]
    (tmp_path / "config.yaml").write_text("a: 1\n")
    (tmp_path / "x.safetensors").write_bytes(b"not a header at all")
    (tmp_path / "empty").mkdir()
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00002.safetensors"}}))
    with pytest.raises(ConfigError) as err:
        resolve(str(target))
    message = str(err.value)
    assert message.startswith(f"model.init_from={target}") and words in message and "\n" not in message


# -- do the weights fit the model ------------------------------------------------------------------------------
def test_first_problem_names_the_first_parameter_that_does_not_fit() -> None:
    expected = {"embed.weight": (8, 4), "block.0.w": (4, 4), "head.weight": (8, 4)}
    tied = [["embed.weight", "head.weight"]]
    # A tied output layer saved once is whole; so is the same set with an ignored extra.
    assert first_problem(expected, tied, {"embed.weight": (8, 4), "block.0.w": (4, 4)}) is None
    assert first_problem(expected, tied, {"embed.weight": (8, 4), "block.0.w": (4, 4), "rot.inv_freq": (2,)},
                         [__import__("re").compile(r"inv_freq")]) is None
    assert first_problem(expected, tied, {"embed.weight": (8, 4), "block.0.w": (4, 2)}) == (
        "block.0.w is [4, 4] in the model but [4, 2] in the weights")
    assert first_problem(expected, tied, {"embed.weight": (8, 4), "blocks.0.w": (4, 4)}) == (
        "the weights have no block.0.w (the nearest name there is blocks.0.w)")
    assert first_problem(expected, tied, {"embed.weight": (8, 4), "block.0.w": (4, 4), "block.1.w": (4, 4)}) == (
        "the weights hold block.1.w, which the model has not")


def test_the_launch_check_refuses_another_shape_naming_the_parameter_and_the_fix(saved: dict[str, Path]) -> None:
    from omegaconf import OmegaConf

    fits = OmegaConf.to_container(_model_cfg(f"model.init_from={saved['file']}"), resolve=True)
    assert check({"model": fits}) == {"init_from_tensors": _stored(saved["file"])}  # the tied head: the embedding
    wider = OmegaConf.to_container(_model_cfg(f"model.init_from={saved['file']}", "model.d_model=48"), resolve=True)
    answer = check({"model": wider})
    assert answer["kind"] == "config"
    assert answer["error"] == (f"model.init_from={saved['file']} does not fit the model: embed.weight is [256, 48] in "
                               "the model but [256, 32] in the weights: build the model these weights were saved "
                               "from, or point model.init_from at weights of this model")


@pytest.mark.parametrize("kind", ["file", "torch"])
def test_loading_gives_the_saved_weights_tied_ones_included(saved: dict[str, Path], kind: str) -> None:
    torch.manual_seed(3)
    reference = build_model(_model_cfg()).state_dict()
    torch.manual_seed(99)
    model = build_model(_model_cfg())
    stored = _stored(saved[kind]) if kind == "file" else len(torch.load(saved[kind]))  # a state dict: both tied names
    assert load_into(model, resolve(str(saved[kind]))) == stored
    state = model.state_dict()
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in state)
    assert model.lm_head.weight is model.embed.weight  # still tied


# -- the plan always says which weights a run starts from ------------------------------------------------------
def test_the_plan_says_random_init_resume_and_warns_of_a_saved_model_it_would_not_load(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = compose_config([*SMALL, "trainer.seed=11"])
    assert weights_lines(cfg, run_dir, 1) == ("weights: random init (seed 11)",)
    # model.config_path beside a saved model: still random (as asked), and the plan says how to load it.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 256}))
    (hf / "model.safetensors").write_bytes(b"")
    cfg = compose_config(["model=hf_causal_lm", f"model.config_path={hq(hf)}"])
    assert weights_lines(cfg, run_dir, 1) == (
        "weights: random init (seed 1234)",
        f"warning: model.config_path={hf} sits beside a saved model (model.safetensors) that this run does not load: it "
        f"trains from random weights; add model.init_from={hf} to start from them")
    assert saved_weights(str(hf / "config.json")) == hf / "model.safetensors"
    # On resume the run's checkpoint, whatever model.init_from says (even a path that is gone).
    layout.step_dir(run_dir, 5).mkdir(parents=True)
    layout.write_marker(layout.step_dir(run_dir, 5), step=5)
    cfg = compose_config([*SMALL, f"model.init_from={hq(tmp_path / 'gone')}"])
    assert weights_lines(cfg, run_dir, 1) == ("weights: the run's checkpoint step_5 (model.init_from is not applied on "
                                           "resume)",)
    cfg = compose_config([*SMALL])
    assert weights_lines(cfg, run_dir, 1) == ("weights: the run's checkpoint step_5",)


def test_a_mismatched_shape_is_one_error_line_exit_2_and_nothing_created(saved: dict[str, Path],
                                                                         run_root: Path) -> None:
    before = sorted(saved["root"].rglob("*"))
    out = launch(*SMALL, "model.d_model=64", f"model.init_from={hq(saved['file'])}", f"run.root={hq(run_root)}",
                 "run.name=ft", "trainer.max_steps=2")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert out.stderr.splitlines() == [
        f"error: model.init_from={saved['file']} does not fit the model: embed.weight is [256, 64] in the model but "
        "[256, 32] in the weights: build the model these weights were saved from, or point model.init_from at "
        "weights of this model"]
    assert list(run_root.iterdir()) == [] and sorted(saved["root"].rglob("*")) == before


# -- Hugging Face weights saved under other names than the model's modules ------------------------------------
HF_SMALL = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 64}
MOE = {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}
# (transformers class prefix, config) of save_pretrained directories whose saved names are not the modules':
HF_SAVED = {
    "gpt_neox": ("GPTNeoX", {"tie_word_embeddings": False}),  # the head: lm_head in the model, embed_out saved
    "gpt_neox_tied": ("GPTNeoX", {"tie_word_embeddings": True}),  # the head is the embedding: not saved at all
    "mixtral": ("Mixtral", MOE),  # each expert's w1/w2/w3 saved apart, stacked in the model; block_sparse_moe -> mlp
    "granitemoe": ("GraniteMoe", MOE),  # router.layer saved, router in the model
}


def _saved_names(folder: Path) -> dict[str, tuple[int, ...]]:
    from train.weights.files import tensor_shapes

    return tensor_shapes([p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin")])


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny models saved with save_pretrained (HF_SAVED), Mixtral also in shards with an index, and GPT-NeoX's
    saved tensors as a legacy pytorch_model.bin (the only weights in its directory)."""
    import transformers
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("hf saved")
    out: dict[str, Path] = {}
    for case, (prefix, extra) in HF_SAVED.items():
        torch.manual_seed(5)
        config = getattr(transformers, f"{prefix}Config")(**HF_SMALL, **extra)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config)
        out[case] = root / case
        model.save_pretrained(out[case])
        if case == "mixtral":
            out["mixtral_sharded"] = root / "mixtral sharded"
            model.save_pretrained(out["mixtral_sharded"], max_shard_size="20KB")
    out["gpt_neox_bin"] = root / "gpt_neox bin"
    out["gpt_neox_bin"].mkdir()
    (out["gpt_neox_bin"] / "config.json").write_text((out["gpt_neox"] / "config.json").read_text())
    torch.save(load_file(str(out["gpt_neox"] / "model.safetensors")), out["gpt_neox_bin"] / "pytorch_model.bin")
    return out


def _hf_cfg(config_path: Path, init_from: Path | None = None) -> Any:
    """The config as the plan holds it when it compares (the vocabulary read from config.json)."""
    from contract.rules.hf_config import apply_hf_config

    cfg = compose_config(["model=hf_causal_lm", f"model.config_path={hq(config_path)}",
                          f"model.init_from={hq(init_from or config_path)}", "data.seq_len=16"])
    apply_hf_config(cfg)
    return cfg


HF_CASES = [*HF_SAVED, "mixtral_sharded", "gpt_neox_bin"]


@pytest.mark.parametrize("case", HF_CASES)
def test_hugging_face_weights_load_as_from_pretrained_loads_them(hf_saved: dict[str, Path], case: str) -> None:
    from transformers import AutoModelForCausalLM

    from train.model.hf import causal_lm

    folder = hf_saved[case]
    saved = _saved_names(folder)
    torch.manual_seed(99)
    model = causal_lm(str(folder))
    assert set(saved) != set(model.state_dict())  # the case is one: the saved names are not the modules'
    if case == "mixtral_sharded":
        assert len(resolve(str(folder)).files) > 1
    reference = AutoModelForCausalLM.from_pretrained(folder)
    assert load_into(model, resolve(str(folder))) == len(saved)  # every saved tensor read, none left over
    state, expected = model.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    assert [k for k in state if not torch.equal(state[k], expected[k])] == []
    ids = torch.randint(0, HF_SMALL["vocab_size"], (2, 8))
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, reference(ids).logits)
    if case == "gpt_neox_tied":
        assert "embed_out.weight" not in saved and model.lm_head.weight is model.gpt_neox.embed_in.weight


@pytest.mark.parametrize("case", HF_CASES)
def test_the_launch_check_accepts_them(hf_saved: dict[str, Path], case: str) -> None:
    """The launch probe's answer (train/model/probe.py, what `python -m launcher.worker --probe` runs): the model on the
    meta device against the files' headers, under the names the ranks load."""
    from launcher.plan.probe import probe_request
    from train.model.probe import probe

    answer = probe(probe_request(_hf_cfg(hf_saved[case]), 1))
    assert answer.get("init_from_tensors") == len(_saved_names(hf_saved[case])), answer


def test_the_plan_says_a_gpt_neox_directory_loads(hf_saved: dict[str, Path], tmp_path: Path) -> None:
    """The issue's case as the launcher plans it (a child process compares): refused before, 28 tensors now."""
    folder = hf_saved["gpt_neox"]
    assert weights_lines(_hf_cfg(folder), tmp_path / "run", 1) == (
        f"weights: from {folder} ({len(_saved_names(folder))} tensors)",)


def test_converted_weights_that_do_not_fit_name_the_models_parameter(hf_saved: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """Mixtral's experts saved apart, checked as the model holds them (stacked): another expert width names the
    stacked tensor; the fix names the directory the weights were saved with."""
    config = json.loads((hf_saved["mixtral"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    from launcher.plan.probe import probe_request
    from train.model.probe import probe

    folder = hf_saved["mixtral"]
    answer = probe(probe_request(_hf_cfg(tmp_path, folder), 1))
    assert answer.get("error") == (
        f"model.init_from={folder} does not fit the model: model.layers.0.mlp.experts.gate_up_proj is [4, 192, 32] "
        "in the model but [4, 128, 32] in the weights: build the model they were saved with: model=hf_causal_lm "
        f"model.config_path={folder}")



def test_saved_tensors_transformers_cannot_convert_are_one_line(hf_saved: dict[str, Path], tmp_path: Path) -> None:
    """One expert's w3 of another width: the converter that stacks the experts can't, and the launch says which
    tensors, in one line, before anything runs."""
    from safetensors.torch import load_file

    from launcher.plan.probe import probe_request
    from train.model.probe import probe

    (tmp_path / "config.json").write_text((hf_saved["mixtral"] / "config.json").read_text())
    tensors = load_file(str(hf_saved["mixtral"] / "model.safetensors"))
    tensors["model.layers.0.block_sparse_moe.experts.0.w3.weight"] = torch.zeros(60, 32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    error = probe(probe_request(_hf_cfg(tmp_path), 1)).get("error", "")
    assert error.startswith(
        f"model.init_from={tmp_path} does not fit the model: transformers could not convert "
        "model.layers.0.block_sparse_moe.experts.0.w1.weight and 7 more into model.layers.0.mlp.experts.gate_up_proj "
        "(RuntimeError: stack expects each tensor to be equal size"), error
    assert error.endswith("): build the model these weights were saved from, or point model.init_from at weights of "
                          "this model") and "\n" not in error
