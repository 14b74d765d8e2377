"""data.document_mask (issue 31, item 5): documents from the prepared data, attention within them and positions
from their starts in the model (dense mask and flex attention's rule), and what the launch refuses or plans."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from contract.data.documents import document_ids
from contract.errors import ConfigError
from contract.rules.document_mask import check_document_mask
from launcher.compose import compose_and_plan, compose_config
from tests.prepared_data import random_documents, write_prepared
from train.data.batches import load_micro_batch
from train.data.sources import token_source
from train.model import document_mask as dm
from train.model.transformer import Transformer

EOD = 256


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("docmask")
    write_prepared(root / "prep", [random_documents(0, 3000)], [random_documents(1, 1000)])
    write_prepared(root / "other", [random_documents(2, 2000)], [random_documents(3, 1000)])
    (np.arange(2000) % 256).astype(np.uint16).tofile(root / "flat.bin")
    (root / "llama").mkdir()
    (root / "llama" / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 257, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 64}))
    return {"prep": root / "prep", "other": root / "other", "flat": root / "flat.bin", "llama": root / "llama"}


BASE = ["run.root=/tmp/x", "model=tiny", "model.vocab_size=257", "data=tokens", "data.document_mask=true"]


def test_document_ids_count_the_ends_of_documents_before_each_token() -> None:
    tokens = np.array([[5, 6, EOD, 7, EOD, EOD, 8], [EOD, 1, 2, 3, 4, 5, 6]])
    assert document_ids(tokens, EOD).tolist() == [[0, 0, 0, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]


def test_batches_carry_the_documents_the_prepared_data_records(data: dict[str, Path]) -> None:
    cfg = compose_config([*BASE, f"data.path={data['prep']}"])
    source = token_source(cfg.data)
    inputs, targets, docs = load_micro_batch(source, range(3), documents=True)
    assert docs.shape == inputs.shape and docs.dtype == torch.int32
    expected = np.zeros(inputs.shape, dtype=np.int32)
    expected[:, 1:] = np.cumsum(inputs[:, :-1].numpy() == EOD, axis=1)
    assert (docs.numpy() == expected).all() and docs.max() > 0  # the windows hold several documents
    assert len(load_micro_batch(source, range(3))) == 2  # without the mask, batches are as before
    mix = compose_config([*BASE, f"data.sources.a.path={data['prep']}", f"data.sources.b.path={data['other']}"])
    mixed = token_source(mix.data)
    inputs, _, docs = load_micro_batch(mixed, range(8), documents=True)
    assert (docs[:, 1:] == torch.cumsum(inputs[:, :-1] == EOD, dim=1)).all()
    flat = token_source(compose_config([*BASE, f"data.path={data['flat']}"]).data)
    with pytest.raises(ValueError, match="records no documents"):
        load_micro_batch(flat, range(2), documents=True)


def _model(position: str) -> Transformer:
    cfg = OmegaConf.create({"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                            "ffn_hidden": 64, "max_seq_len": 64, "position": position, "rope_theta": 10000.0,
                            "norm": "rmsnorm" if position == "rope" else "layernorm",
                            "mlp": "swiglu" if position == "rope" else "gelu", "dropout": 0.0,
                            "tie_embeddings": False, "init_std": 0.02})
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_a_packed_document_computes_as_it_does_alone(position: str) -> None:
    model = _model(position)
    first, second = torch.randint(0, 64, (2, 11)), torch.randint(0, 64, (2, 21))
    packed = torch.cat([first, second], 1)
    docs = torch.cat([torch.zeros(2, 11), torch.ones(2, 21)], 1).int()
    with torch.no_grad():
        alone = model(second)
        masked = model(packed, document_ids=docs)
        unmasked = model(packed)
    assert torch.allclose(masked[:, 11:], alone, atol=1e-5)
    assert torch.allclose(masked[:, :11], model(first).detach(), atol=1e-5)
    assert (unmasked[:, 11:] - alone).abs().max() > 1e-2  # without the mask the second document sees the first


def test_positions_restart_at_each_document() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0] * 9])
    assert dm.positions_in_documents(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3], list(range(9))]


def test_flex_attention_masks_as_the_dense_path_does() -> None:
    """The GPU path's rule (a BlockMask over 128-token blocks, eager here: tests/gpu runs it compiled on CUDA)."""
    torch.manual_seed(0)
    docs = torch.tensor([[0] * 5 + [1] * 130 + [2] * 121, [0] * 256])
    q, k, v = (torch.randn(2, 4, 256, 8) for _ in range(3))
    dense = dm.masked_attention(q, k, v, dm.dense_mask(docs), 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex attention warns that it is for debugging
        flex = dm.masked_attention(q, k, v, dm.flex_mask(docs, compiled=False), 0.0, compiled=False)
    assert torch.allclose(dense, flex, atol=1e-5)
    with pytest.raises(ValueError, match="set model.dropout=0"):
        dm.masked_attention(q, k, v, dm.flex_mask(docs, compiled=False), 0.1, compiled=False)


def test_the_plan_says_which_attention_runs(data: dict[str, Path]) -> None:
    _, plan = compose_and_plan([*BASE, f"data.path={data['prep']}"])
    assert ("attention: block-causal by document, positions restart at each document (dense mask on CPU, 64 x 64 "
            "booleans = 4 KB per sample)") in plan.summary()
    _, plain = compose_and_plan([*BASE[:-1], f"data.path={data['prep']}"])
    assert "attention:" not in plain.summary()


@pytest.mark.parametrize("overrides, words", [
    (["data=synthetic"], "data=synthetic has none: train on data=tokens data.path=DIR"),
    (["data.path={flat}"], "data.path={flat} is a token file, which records none: prepare the text with"),
    (["data.sources.a.path={prep}", "data.sources.b.path={flat}"], "data.sources.b.path={flat} is a token file"),
    (["data.path={prep}", "eval.every=2", "eval.sets.s.kind=synthetic"],
     "masks validation too and eval.sets.s.kind=synthetic records no documents"),
    (["data.path={prep}", "eval.every=2", "eval.sets.t.kind=tokens", "eval.sets.t.path={flat}"],
     "eval.sets.t.path={flat} is a token file"),
    (["data.path={prep}", "model=hf_causal_lm", "model.config_path={llama}"],
     "model=hf_causal_lm is a Hugging Face model, which would attend across documents: use model=tiny"),
])
def test_what_has_no_documents_or_no_mask_is_refused_in_one_line(data: dict[str, Path], overrides: list[str],
                                                                  words: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_and_plan([*BASE, *(o.format(**data) for o in overrides)])
    assert words.format(**data) in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).endswith("or drop data.document_mask")


def test_flex_attention_refuses_attention_dropout_on_gpus(data: dict[str, Path]) -> None:
    cfg = compose_config([*BASE, f"data.path={data['prep']}", "model.dropout=0.1"])
    check_document_mask(cfg, on_gpus=False)  # the dense path drops out
    with pytest.raises(ConfigError, match="flex attention has no attention dropout; set model.dropout=0"):
        check_document_mask(cfg, on_gpus=True)
