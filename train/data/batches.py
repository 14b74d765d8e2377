"""Micro batches by global sample index, and the shapes a sample may take.

The position in the stream is one integer, the number of samples consumed by all ranks together. Each optimizer
step consumes `global_batch` consecutive indices; rank r of a data-parallel group of size D takes, for micro
step m, the indices `position + (m * D + r) * micro + [0, micro)`. Shards are therefore disjoint, and the same
position means the same next samples whatever the world size (resume on another number of ranks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from train.data.token_source import TokenSource


def micro_batch_indices(position: int, micro_step: int, dp_rank: int, dp_size: int, micro: int) -> range:
    start = position + (micro_step * dp_size + dp_rank) * micro
    return range(start, start + micro)


def planned_micro_batches(position: int, steps: int, accum: int, dp_rank: int, dp_size: int,
                          micro: int) -> Iterator[range]:
    """The indices of every micro batch this rank takes in the next `steps` optimizer steps from `position`, in
    the order train_step asks for them (what the prefetcher walks ahead on)."""
    global_batch = micro * accum * dp_size
    for step in range(steps):
        for micro_step in range(accum):
            yield micro_batch_indices(position + step * global_batch, micro_step, dp_rank, dp_size, micro)


# Targets with this value are left out of the loss (Hugging Face's convention for padding and prompts).
IGNORE_INDEX = -100


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def split_sample(item: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one sample in any of the shapes TokenSource.sample may return."""
    if isinstance(item, dict):
        if "input_ids" not in item:
            raise TypeError(f"a data sample is a dict with keys {sorted(item)}: it needs input_ids (and labels)")
        ids = _as_tensor(item["input_ids"])
        if "labels" in item:  # labels aligned with input_ids, shifted here as Hugging Face models do
            labels = _as_tensor(item["labels"])
            return ids[:-1], labels[1:]
        return ids[:-1], ids[1:]
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return _as_tensor(item[0]), _as_tensor(item[1])
    tokens = _as_tensor(item)
    if tokens.dim() != 1:
        raise TypeError(f"a data sample has shape {tuple(tokens.shape)}: return a 1-D token sequence of seq_len + 1, "
                        "an (inputs, targets) pair or a dict with input_ids")
    return tokens[:-1], tokens[1:]


def load_micro_batch(source: TokenSource, indices: Sequence[int],
                     documents: bool = False) -> tuple[torch.Tensor, ...]:
    """(inputs, targets) [micro, seq_len] of these global samples, on the CPU; sources with a `micro_batch` (the
    supervised fine-tuning samples: targets IGNORE_INDEX outside responses) or a `sample_batch` (the synthetic
    stream) make the whole micro batch in one vectorised call. `documents` (data.document_mask): a third tensor,
    each input token's document within its sample, as the source records them (forward_kwargs)."""
    micro_batch = getattr(source, "micro_batch", None)
    sample_batch = getattr(source, "sample_batch", None)
    if micro_batch is not None:
        inputs, targets = micro_batch(indices)
        batch: tuple[torch.Tensor, ...] = (torch.from_numpy(np.ascontiguousarray(inputs)),
                                           torch.from_numpy(np.ascontiguousarray(targets)))
    elif sample_batch is not None:
        tokens = torch.from_numpy(sample_batch(indices))
        batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    else:
        pairs = [split_sample(source.sample(i)) for i in indices]
        batch = (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))
    if not documents:
        return batch
    ids_of = getattr(source, "document_ids", None)
    if ids_of is None:
        raise ValueError(f"data.document_mask=true needs document boundaries and a {type(source).__name__} records "
                         "none: train on prepared datasets (python -m launcher.prepare)")
    return (*batch, torch.from_numpy(np.ascontiguousarray(ids_of(indices))))


def forward_kwargs(extra: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the model takes beside the inputs, from a batch's tensors after (inputs, targets): document_ids."""
    return {"document_ids": extra[0]} if extra else {}
