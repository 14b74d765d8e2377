"""What a data config reads: one TokenSource, chosen once from data.name (or data._target_)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from launcher.errors import ConfigError
from train.data.index import INDEX_VERSION


class TokenSource(Protocol):
    def sample(self, index: int) -> Any:
        """The sample with this global index: tokens [seq_len + 1] (inputs plus the shifted target), an
        (inputs, targets) pair, or a dict with input_ids (and labels)."""


def build_source(data_cfg: Any, vocab_size: int, index_version: int = INDEX_VERSION) -> TokenSource:
    """`index_version`: the window order of the checkpoint being resumed (train/data/index.py)."""
    if data_cfg.get("_target_"):
        from train.data.dataset import build_dataset_source

        return build_dataset_source(data_cfg, index_version)
    if data_cfg.name == "synthetic":
        from train.data.synthetic import SyntheticTokens

        return SyntheticTokens(vocab_size, data_cfg.seq_len, data_cfg.seed, data_cfg.signal)
    if data_cfg.name == "tokens":
        from train.data.windows import MemmapTokens

        if not data_cfg.path or not Path(data_cfg.path).expanduser().is_file():
            raise ConfigError(f"data.path={data_cfg.path} is not a file here (was it moved after submitting?): "
                              "point data.path at the token file")
        return MemmapTokens(data_cfg.path, data_cfg.dtype, data_cfg.seq_len, data_cfg.seed, data_cfg.shuffle,
                            index_version)
    raise ValueError(f"unknown data source {data_cfg.name!r}")
