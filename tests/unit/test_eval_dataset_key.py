"""An evaluation set of kind=dataset that can't be built names its own key (eval.sets.NAME._target_), not data's."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from train.evaluation.validator import build_set_source


def test_a_dataset_set_that_cannot_be_imported_names_its_own_key() -> None:
    cfg = OmegaConf.create({"data": {"seq_len": 16, "seed": 0}, "model": {"vocab_size": 256}})
    with pytest.raises(ConfigError) as err:
        build_set_source(cfg, {"kind": "dataset", "_target_": "nope_module_xyz.Mod"}, "x")
    assert str(err.value).startswith("eval.sets.x._target_=nope_module_xyz.Mod "), str(err.value)
