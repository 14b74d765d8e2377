"""Token sources addressed by a global sample index: what a sample is is a pure function of its index, the data
config and the seed, so a resume on any number of ranks continues exactly.

    token_source.py TokenSource: what every source is, a sample per global index
    sources.py      build_source: the one source a data config reads; data_progress for metrics
    synthetic.py    data=synthetic, a learnable stream
    windows.py      token files as one stream (TokenStream) and its windows as samples (WindowSource, MemmapTokens)
    index.py        the order of windows within an epoch: a keyed bijection, never materialised; INDEX_VERSION
    prepared.py     a prepared dataset's validation split as sources (its train split is read through the spec)
    sft.py          supervised fine-tuning samples: targets IGNORE_INDEX outside responses, packed or padded
    prefetch.py     micro batches prepared off the critical path by a worker thread
    dataset.py      a user's map-style dataset (data._target_)
    batches.py      micro batches by global index (micro_batch_indices, load_micro_batch, split_sample); the
                    model's extra inputs (forward_kwargs: document ids)

What data=tokens points at, resolved (spec), a mixture's apportionment and the data fingerprint are the
contract's (contract/data/), which the launcher checks too. Only batches.py and dataset.py need torch; this package
imports its modules when a name is first asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "TokenSource": "token_source", "build_source": "sources", "data_progress": "sources",
    "SyntheticTokens": "synthetic",
    "TokenStream": "windows", "WindowSource": "windows", "MemmapTokens": "windows",
    "INDEX_VERSION": "index", "EpochOrder": "index",
    "DatasetSource": "dataset",
    "IGNORE_INDEX": "batches", "micro_batch_indices": "batches", "planned_micro_batches": "batches",
    "split_sample": "batches", "load_micro_batch": "batches", "forward_kwargs": "batches",
}
__all__ = ["INDEX_VERSION", "IGNORE_INDEX", "DatasetSource", "EpochOrder", "MemmapTokens", "SyntheticTokens",
           "TokenSource", "TokenStream", "WindowSource", "build_source", "data_progress", "forward_kwargs", "load_micro_batch",
           "micro_batch_indices", "planned_micro_batches", "split_sample"]

if TYPE_CHECKING:
    from train.data.batches import (
        IGNORE_INDEX,
        forward_kwargs,
        load_micro_batch,
        micro_batch_indices,
        planned_micro_batches,
        split_sample,
    )
    from train.data.dataset import DatasetSource
    from train.data.index import INDEX_VERSION, EpochOrder
    from train.data.sources import build_source, data_progress
    from train.data.synthetic import SyntheticTokens
    from train.data.token_source import TokenSource
    from train.data.windows import MemmapTokens, TokenStream, WindowSource


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'train.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"train.data.{_HOMES[name]}"), name)
