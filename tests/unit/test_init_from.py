"""model.init_from at launch: where the path points (train/init_source.py), whether the weights fit the model
(train/init_weights.py), the plan's weights line (launcher/plan/init_from.py), and a mismatch refused as a user sees it:
one `error:` line, exit 2, nothing created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file, save_model

from launcher.compose import compose_config
from launcher.errors import EXIT_BAD_INPUT, ConfigError
from launcher.plan.init_from import weights_lines
from tests.conftest import hq, launch
from train import ckpt_layout as layout
from train.build import build_model
from train.init_source import resolve, saved_weights
from train.init_weights import check, first_problem, load_into

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
