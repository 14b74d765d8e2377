"""A user's map-style dataset (data._target_) as a token source."""

from __future__ import annotations

from typing import Any

import numpy as np

from contract.errors import ConfigError
from train.data.batches import split_sample
from train.data.index import INDEX_VERSION, Order, epoch_order

# A user's dataset is shuffled with this salt (index version 1 used it in numpy's seed, [seed, 3, epoch]).
DATASET_SALT = 3


class DatasetSource:
    """Global index i is item i mod len; the items of each epoch in an order shuffled by the seed (index.py), or
    in order."""

    def __init__(self, dataset: Any, seed: int, shuffle: bool, index_version: int = INDEX_VERSION) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"data._target_ built a {type(dataset).__name__}, which has no __len__ and __getitem__: "
                            "slurmtrain resumes exactly by sample index, so it needs a map-style dataset")
        self.dataset = dataset
        self.size = len(dataset)
        if self.size < 1:
            raise ValueError(f"data._target_ built an empty {type(dataset).__name__}")
        self.order: Order = epoch_order(self.size, seed, DATASET_SALT, shuffle=shuffle, version=index_version)

    def sample(self, index: int) -> Any:
        return self.dataset[int(self.order(np.asarray([index]))[0])]


def build_dataset_source(data_cfg: Any, index_version: int = INDEX_VERSION,
                         key: str = "data._target_") -> DatasetSource:
    """data._target_ instantiated with data.args; its first sample must hold data.seq_len (+1) tokens. `key`: the
    config key errors name (an evaluation set's own, eval.sets.NAME._target_)."""
    from train.model.build import instantiate

    source = DatasetSource(instantiate(key, data_cfg._target_, data_cfg.args), data_cfg.seed,
                           data_cfg.shuffle, index_version)
    inputs, _ = split_sample(source.sample(0))
    if inputs.dim() == 1 and not inputs.is_floating_point() and len(inputs) != data_cfg.seq_len:
        # Tokens per step (throughput, MFU, the plan) are counted with data.seq_len: they must agree.
        raise ConfigError(f"{key}={data_cfg._target_} gives samples of {len(inputs)} input tokens but "
                          f"data.seq_len={data_cfg.seq_len}: a sample holds seq_len + 1 tokens (inputs and the "
                          f"shifted targets; a dict's input_ids too), so make the dataset return "
                          f"{data_cfg.seq_len + 1} or set data.seq_len={len(inputs)}")
    return source
