"""Token sources addressed by a global sample index.

The position in the stream is one integer, the number of samples consumed by all ranks together. Each optimizer
step consumes `global_batch` consecutive indices; rank r of a data-parallel group of size D takes, for micro
step m, the indices `position + (m * D + r) * micro + [0, micro)`. Shards are therefore disjoint, and the same
position means the same next samples whatever the world size (resume on another number of ranks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from launcher.errors import ConfigError


class TokenSource(Protocol):
    def sample(self, index: int) -> Any:
        """The sample with this global index: tokens [seq_len + 1] (inputs plus the shifted target), an
        (inputs, targets) pair, or a dict with input_ids (and labels)."""


class SyntheticTokens:
    """A learnable stream: the next token follows a hidden transition table with probability `signal`."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, signal: float) -> None:
        self.vocab_size, self.seq_len, self.seed, self.signal = vocab_size, seq_len, seed, signal
        self.table = np.random.default_rng([seed, 0]).permutation(vocab_size)
        self._powers = [self.table]

    def sample(self, index: int) -> np.ndarray:
        return self.sample_batch(range(index, index + 1))[0]

    def sample_batch(self, indices: Sequence[int]) -> np.ndarray:
        """Samples [len(indices), seq_len + 1], bitwise what a per-token loop over each sample gives: each sample
        keeps its own generator (seeded by its global index, so resume and resharding stay exact); only the
        transition chain is vectorised (over the batch and the sequence), which was the per-step Python cost."""
        n = self.seq_len + 1
        noise = np.empty((len(indices), n), dtype=np.int64)
        follow = np.empty((len(indices), n), dtype=bool)
        for row, index in enumerate(indices):
            rng = np.random.default_rng([self.seed, 1, index])
            noise[row] = rng.integers(0, self.vocab_size, size=n)
            follow[row] = rng.random(n) < self.signal
        follow[:, 0] = False  # the first token is always noise
        # Token t is table^d applied to the noise token where its run of follows started, d steps back.
        positions = np.broadcast_to(np.arange(n), follow.shape)
        start = np.maximum.accumulate(np.where(follow, 0, positions), axis=1)
        out = np.take_along_axis(noise, start, axis=1)
        distance = positions - start
        for bit, power in enumerate(self._table_powers(int(distance.max()).bit_length())):
            out = np.where((distance >> bit) & 1 == 1, power[out], out)
        return out

    def _table_powers(self, bits: int) -> list[np.ndarray]:
        """table^(2^b) for b < bits, composed once per source (commuting powers of one permutation, so the
        order they are applied in does not matter: binary exponentiation)."""
        while len(self._powers) < bits:
            last = self._powers[-1]
            self._powers.append(last[last])
        return self._powers[:bits]


class MemmapTokens:
    """Windows of a flat binary file of token ids; window order shuffled per epoch by the seed."""

    def __init__(self, path: str, dtype: str, seq_len: int, seed: int, shuffle: bool) -> None:
        self.tokens = np.memmap(Path(path).expanduser(), dtype=np.dtype(dtype), mode="r")
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        self.windows = (len(self.tokens) - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{path} holds {len(self.tokens)} tokens, fewer than one sample of {seq_len + 1}")
        self._order: dict[int, np.ndarray] = {}

    def _window(self, index: int) -> int:
        epoch, offset = divmod(index, self.windows)
        if not self.shuffle:
            return offset
        if epoch not in self._order:
            self._order = {epoch: np.random.default_rng([self.seed, 2, epoch]).permutation(self.windows)}
        return int(self._order[epoch][offset])

    def sample(self, index: int) -> np.ndarray:
        start = self._window(index) * self.seq_len
        return np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)


class DatasetSource:
    """A user's map-style dataset (`data._target_`) as a token source: global index i is item i mod len, the
    items of each epoch in an order shuffled by the seed (or in order)."""

    def __init__(self, dataset: Any, seed: int, shuffle: bool) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"data._target_ built a {type(dataset).__name__}, which has no __len__ and __getitem__: "
                            "slurmtrain resumes exactly by sample index, so it needs a map-style dataset")
        self.dataset, self.seed, self.shuffle = dataset, seed, shuffle
        self.size = len(dataset)
        if self.size < 1:
            raise ValueError(f"data._target_ built an empty {type(dataset).__name__}")
        self._order: dict[int, np.ndarray] = {}

    def sample(self, index: int) -> Any:
        epoch, offset = divmod(index, self.size)
        if self.shuffle:
            if epoch not in self._order:
                self._order = {epoch: np.random.default_rng([self.seed, 3, epoch]).permutation(self.size)}
            offset = int(self._order[epoch][offset])
        return self.dataset[offset]


def build_source(data_cfg: Any, vocab_size: int) -> TokenSource:
    if data_cfg.get("_target_"):
        from train.build import instantiate

        source = DatasetSource(instantiate("data._target_", data_cfg._target_, data_cfg.args), data_cfg.seed,
                               data_cfg.shuffle)
        inputs, _ = split_sample(source.sample(0))
        if inputs.dim() == 1 and not inputs.is_floating_point() and len(inputs) != data_cfg.seq_len:
            # Tokens per step (throughput, MFU, the plan) are counted with data.seq_len: they must agree.
            raise ConfigError(f"data._target_={data_cfg._target_} gives samples of {len(inputs)} input tokens but "
                             f"data.seq_len={data_cfg.seq_len}: a sample holds seq_len + 1 tokens (inputs and the "
                             f"shifted targets; a dict's input_ids too), so make the dataset return "
                             f"{data_cfg.seq_len + 1} or set data.seq_len={len(inputs)}")
        return source
    if data_cfg.name == "synthetic":
        return SyntheticTokens(vocab_size, data_cfg.seq_len, data_cfg.seed, data_cfg.signal)
    if data_cfg.name == "tokens":
        if not data_cfg.path or not Path(data_cfg.path).expanduser().is_file():
            raise ConfigError(f"data.path={data_cfg.path} is not a file here (was it moved after submitting?): "
                              "point data.path at the token file")
        return MemmapTokens(data_cfg.path, data_cfg.dtype, data_cfg.seq_len, data_cfg.seed, data_cfg.shuffle)
    raise ValueError(f"unknown data source {data_cfg.name!r}")


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


def load_micro_batch(source: TokenSource, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) [micro, seq_len] of these global samples, on the CPU; sources with a `sample_batch`
    (the synthetic stream) make the whole micro batch in one vectorised call."""
    sample_batch = getattr(source, "sample_batch", None)
    if sample_batch is not None:
        tokens = torch.from_numpy(sample_batch(indices))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    pairs = [split_sample(source.sample(i)) for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
