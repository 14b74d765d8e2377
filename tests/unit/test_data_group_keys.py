"""Token data on disk typed without data=tokens is refused, never ignored: found by trying
`python -m launcher data.path=DIR ...` on a freshly prepared directory, which trained on the synthetic stream (the
default data group) and said nothing; data.sources already named the fix. A dataset of one's own (data._target_)
may read data.path itself and is left alone."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.checks.input_checks import check_token_data


def cfg(**data: object) -> object:
    return OmegaConf.create({"data": {"name": "synthetic", "path": None, "sources": {}, "seq_len": 64, **data},
                             "model": {"vocab_size": 256}})


def test_data_path_without_data_tokens_is_refused_naming_the_group() -> None:
    with pytest.raises(ConfigError, match=r"^data.path=/tmp/corpus is token data on disk, which data=synthetic "
                                          r"does not read: add data=tokens$"):
        check_token_data(cfg(path="/tmp/corpus"))


def test_the_synthetic_stream_alone_and_a_dataset_of_ones_own_pass() -> None:
    check_token_data(cfg())
    check_token_data(cfg(path="/tmp/corpus", _target_="my_data.Dataset"))
