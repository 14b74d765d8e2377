"""Bring-your-own models and data on the compute side: blocks found or named, any sample shape, any output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from train.data import DatasetSource, load_micro_batch
from train.model.blocks import BlockError, find_blocks, prepare_blocks
from train.model.build import TargetError, build_model, logits_of, resolve_target
from train.model.probe import probe
from train.model.probe_build import build_for_probe
from train.weights.files import tensor_shapes, weight_files


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # Two identical experts: a list inside each block, smaller than the list of blocks.
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.proj = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(x) + self.experts[0](x)


class Stack(nn.Module):
    """Blocks in an nn.Sequential under a nested name, beside a smaller list of identical heads."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.trunk = nn.Module()
        self.trunk.layers = nn.Sequential(*(Layer() for _ in range(3)))
        self.heads = nn.ModuleList(nn.Linear(8, 16) for _ in range(2))

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.heads[0](self.trunk.layers(self.embed(tokens)))}


class Flat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)


def test_blocks_are_the_largest_list_of_one_class() -> None:
    named = find_blocks(Stack(), None)
    assert [name for name, _ in named] == ["trunk.layers.0", "trunk.layers.1", "trunk.layers.2"]


def test_hugging_face_declared_blocks_win() -> None:
    model = Stack()
    model._no_split_modules = ["Linear"]  # type: ignore[assignment]
    # Outermost Linear modules: four in each of the three layers and the two heads.
    assert len(find_blocks(model, None)) == 14


def test_a_named_block_and_the_errors_that_name_the_fix() -> None:
    assert [n for n, _ in find_blocks(Stack(), "Linear")][-2:] == ["heads.0", "heads.1"]
    assert find_blocks(Flat(), "none") == []
    with pytest.raises(BlockError, match="model.block=ClassName"):
        find_blocks(Flat(), None)
    with pytest.raises(BlockError, match="pick one of Embedding, Linear"):
        find_blocks(Flat(), "Nope")


def test_checkpointing_wraps_nested_blocks_and_keeps_the_math() -> None:
    torch.manual_seed(0)
    model = Stack()
    tokens = torch.randint(0, 16, (2, 5))
    before = logits_of(model(tokens))
    blocks = prepare_blocks(model, OmegaConf.create({"block": None}),
                            OmegaConf.create({"activation_checkpointing": True, "compile": False}))
    assert len(blocks) == 3 and all(type(b).__name__ == "CheckpointWrapper" for b in blocks)
    assert model.trunk.layers[1] is blocks[1]
    after = logits_of(model(tokens))
    assert torch.equal(before, after)
    # State-dict names are the model's own, with or without the wrapper.
    assert "trunk.layers.0.proj.0.weight" in model.state_dict()


def test_checkpointing_without_blocks_is_refused() -> None:
    with pytest.raises(BlockError, match="model.block=ClassName"):
        prepare_blocks(Flat(), OmegaConf.create({"block": "none"}),
                       OmegaConf.create({"activation_checkpointing": True, "compile": False}))


def test_targets_resolve_or_say_what_is_wrong() -> None:
    assert resolve_target("model._target_", "torch.nn.Linear") is nn.Linear
    with pytest.raises(TargetError, match="run from the directory that holds no_such_pkg.py"):
        resolve_target("model._target_", "no_such_pkg.Model")
    with pytest.raises(TargetError, match="names no module: write it as module.GRULM"):
        resolve_target("model._target_", "GRULM")
    with pytest.raises(TargetError, match="torch.nn has no Nope"):
        resolve_target("model._target_", "torch.nn.Nope")
    model = build_model(OmegaConf.create({"_target_": "torch.nn.Linear", "args": {"in_features": 3,
                                                                                 "out_features": 2}}))
    assert isinstance(model, nn.Linear) and model.out_features == 2
    with pytest.raises(TypeError, match="not a torch nn.Module"):
        build_model(OmegaConf.create({"_target_": "builtins.dict", "args": {}}))


def test_a_users_module_importing_its_own_train_package_is_told_the_name_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project with a train/ of its own, whose model module imports train.utils: `train` is ours, so the import
    fails; the error says why and what to rename, not only "No module named 'train.utils'"."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "__init__.py").write_text("")
    (tmp_path / "train" / "utils.py").write_text("def helper():\n    return 1\n")
    (tmp_path / "shadowed_model.py").write_text("from train.utils import helper\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetError, match=r"No module named 'train.utils'; `train` is slurmtrain's own package .* "
                                          r"rename yours \(e.g. to my_train/\)"):
        resolve_target("model._target_", "shadowed_model.TinyLM")
    with pytest.raises(TargetError) as other:  # any other missing module: the error as it was
        resolve_target("model._target_", "torch.no_such_module_here.X")
    assert "slurmtrain's own package" not in str(other.value)


class Pairs:
    """(features, class) pairs: not a language model at all."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((3,), float(i)), torch.tensor(i % 2)


class Dicts:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": [i, i + 1, i + 2, i + 3], "labels": [-100, i + 1, i + 2, i + 3]}


def test_dataset_items_of_any_shape_make_batches() -> None:
    x, y = load_micro_batch(DatasetSource(Pairs(), seed=0, shuffle=False), range(6, 8))
    assert x.shape == (2, 3) and x[0, 0] == 1.0 and y.tolist() == [1, 0]  # index 6 is item 1 (epoch 2)
    x, y = load_micro_batch(DatasetSource(Dicts(), seed=0, shuffle=False), range(0, 2))
    assert x.tolist() == [[0, 1, 2], [1, 2, 3]] and y.tolist() == [[1, 2, 3], [2, 3, 4]]


def test_dataset_order_is_a_seeded_permutation_per_epoch() -> None:
    source = DatasetSource(Pairs(), seed=3, shuffle=True)
    epoch0 = [int(source.sample(i)[0][0]) for i in range(5)]
    epoch1 = [int(source.sample(i)[0][0]) for i in range(5, 10)]
    assert sorted(epoch0) == sorted(epoch1) == [0, 1, 2, 3, 4]
    again = DatasetSource(Pairs(), seed=3, shuffle=True)
    assert [int(again.sample(i)[0][0]) for i in range(5)] == epoch0
    with pytest.raises(TypeError, match="map-style"):
        DatasetSource(iter([1, 2]), seed=0, shuffle=False)


# -- the launch probe of a model that loads weights as it is built (train/model/probe.py, train/model/probe_build.py) ----------


def _request(target: str, strategy: str = "fsdp", world_size: int = 2, **args: object) -> dict:
    return {"model": {"_target_": f"tests.fixtures.user_models.{target}", "vocab_size": 64, "args": args},
            "strategy": {"name": strategy}, "seq_len": 16, "world_size": world_size}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained TinyLM as safetensors and torch files, a low-rank adapter, and a tiny Hugging Face directory
    (save_pretrained of tests/fixtures/tiny_llama's config)."""
    from safetensors.torch import save_file

    from tests.fixtures.user_models import TinyLM
    from train.model.hf import causal_lm

    folder = tmp_path_factory.mktemp("pretrained")
    base = TinyLM(64)
    save_file(base.state_dict(), str(folder / "base.safetensors"))
    torch.save(base.state_dict(), folder / "base.pt")
    torch.save({"A": torch.randn(4, 32), "B": torch.randn(64, 4)}, folder / "lora.pt")
    causal_lm(str(FIXTURES / "tiny_llama")).save_pretrained(str(folder / "hf"))
    return folder


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _real(target: str, **args: object) -> nn.Module:
    return build_model(OmegaConf.create({"_target_": f"tests.fixtures.user_models.{target}", "args": args}))


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# The meta build of a model that loads a state dict warns for every tensor before it fails.
@pytest.mark.filterwarnings("ignore:.*copying from a non-meta parameter")
@pytest.mark.parametrize("target, files", [("grown_from_safetensors", {"path": "base.safetensors", "extra_tokens": 8}),
                                           ("merged_from_torch", {"path": "base.pt", "adapter": "lora.pt"}),
                                           ("hf_from_pretrained", {"path": "hf"})])
def test_a_model_that_loads_weights_is_counted_exactly(pretrained: Path, target: str, files: dict) -> None:
    args = {k: str(pretrained / v) if isinstance(v, str) else v for k, v in files.items()}
    with torch.device("meta"), pytest.raises(Exception):  # noqa: B017 - what the probe did alone before
        _real(target, **args)
    answer = probe(_request(target, **args))
    assert "facts" in answer, answer
    real = _real(target, **args)
    assert answer["facts"]["n_params"] == _count(real)
    assert answer["facts"]["n_blocks"] == 2 and answer["facts"]["block_params"] > 0
    assert answer["note"] == ""  # built for real (on the CPU): nothing to qualify


@pytest.mark.parametrize("target, files", [("grown_from_safetensors", {"path": "base.safetensors"}),
                                           ("hf_from_pretrained", {"path": "hf"})])
def test_a_model_larger_than_the_bound_is_counted_from_its_weight_files(pretrained: Path, target: str,
                                                                        files: dict) -> None:
    args = {k: str(pretrained / v) for k, v in files.items()}
    model_cfg = OmegaConf.create(_request(target, **args)["model"])
    built = build_for_probe(model_cfg, bound=1024)  # smaller than any weight file: the CPU build is not tried
    assert built.model is None and built.facts is not None, built.error
    real = _real(target, **args)
    blocks = find_blocks(real, None)
    assert built.facts["n_params"] == _count(real)
    assert built.facts["n_blocks"] == len(blocks) == 2
    assert built.facts["block_params"] == _count(blocks[0][1])
    assert built.facts["largest_param"] == max(p.numel() for p in real.parameters())
    assert "parameters counted from the shapes in" in built.note and "the 0.0 GB the probe may take here" in built.note


@pytest.mark.filterwarnings("ignore:.*copying from a non-meta parameter")
def test_a_meta_build_that_reads_its_weight_files_stays_within_the_bound(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from tests.fixtures.user_models import TinyLM

    big = TinyLM(8192, dim=512)  # embedding and output layer of 4M floats each: a 32 MB file
    save_file(big.state_dict(), str(tmp_path / "big.safetensors"))
    cfg = OmegaConf.create(_request("from_safetensors", path=str(tmp_path / "big.safetensors"))["model"])
    built = build_for_probe(cfg, bound=16 * 2**20)
    assert built.model is None and built.facts is not None and built.facts["n_params"] == _count(big)
    assert "building the model read more than the 0.0 GB the probe may take here" in built.note
    exact = build_for_probe(cfg, bound=512 * 2**20)
    assert exact.model is not None and _count(exact.model) == _count(big) and exact.note == ""


def test_the_cpu_build_stays_within_its_memory_bound() -> None:
    cfg = OmegaConf.create(_request("GreedyLM", vocab_size=64, megabytes=256)["model"])
    built = build_for_probe(cfg, bound=64 * 2**20)
    assert built.model is None and built.facts is None
    assert "could not be built on the meta device (RuntimeError: Tensor.item() cannot be called on meta" in built.error
    assert "nor on the CPU within the 0.1 GB the probe may take here; model.args names no weight" in built.error
    # The limit is lifted again, and a model within the bound is built (then kept on the meta device).
    assert torch.ones(2**27).sum() == 2**27
    fits = build_for_probe(cfg, bound=1024 * 2**20)
    assert fits.model is not None and _count(fits.model) == _count(_real("GreedyLM", vocab_size=64))
    assert next(fits.model.buffers()).device.type == "meta"


def test_shapes_of_torch_files_are_read_without_their_data(pretrained: Path) -> None:
    shapes = tensor_shapes(weight_files({"nested": [str(pretrained / "base.pt")], "other": "not a path"}))
    assert shapes["embed.weight"] == (64, 32) and shapes["layers.1.down.bias"] == (32,)
    assert weight_files({"path": str(pretrained / "hf")}) == [pretrained / "hf" / "model.safetensors"]
