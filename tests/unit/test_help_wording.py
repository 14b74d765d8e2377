"""Words a user reads in the help, the reference and the plan say whole, true things (issue 48, item 25): no help
description cut off mid-sentence, export names the Mixtral class it writes, a key's reference text describes that
key only, and the dense document mask's size is in bytes, per rank under context parallelism."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from contract.config.training import StrategyConfig
from contract.rules.document_mask import attention_line
from launcher.commands import COMMANDS, build_parser
from launcher.docs.config_reference import schema_keys


@pytest.mark.parametrize("module", [name for name, _ in COMMANDS])
def test_no_help_description_stops_mid_sentence(module: str) -> None:
    description = " ".join((build_parser(module).description or "").split())
    assert description, module
    assert description.rstrip().endswith((".", ")", ":")), f"{module}: ...{description[-60:]!r}"
    assert "one row per run of a run" not in description


def test_export_help_names_the_mixtral_class() -> None:
    assert "MixtralForCausalLM" in " ".join((build_parser("launcher.export").description or "").split())


def test_activation_checkpointing_reference_text_is_about_recomputation_only() -> None:
    docs = {key.name: key.doc for key in schema_keys()}
    text = docs["strategy.activation_checkpointing"]
    assert "recompute" in text and "compile" not in text
    assert {f.name for f in dataclasses.fields(StrategyConfig)} >= {"activation_checkpointing", "compile"}


@pytest.mark.parametrize(("cp", "said"), [
    (1, "2048 x 2048 booleans = 4 MB per sample"),
    (4, "512 x 2048 booleans = 1 MB per sample per rank"),
])
def test_the_dense_document_mask_is_sized_in_bytes(cp: int, said: str) -> None:
    cfg = OmegaConf.create({"data": {"name": "tokens", "document_mask": True, "seq_len": 2048},
                            "parallel": {"cp": cp}, "model": {}})
    line = attention_line(cfg, on_gpus=False)
    assert said in line and "^2" not in line
