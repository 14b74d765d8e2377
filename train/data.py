"""Token sources addressed by a global sample index.

The position in the stream is one integer, the number of samples consumed by all ranks together. Each optimizer
step consumes `global_batch` consecutive indices; rank r of a data-parallel group of size D takes, for micro
step m, the indices `position + (m * D + r) * micro + [0, micro)`. Shards are therefore disjoint, and the same
position means the same next samples whatever the world size (resume on another number of ranks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch


class TokenSource(Protocol):
    def sample(self, index: int) -> np.ndarray:
        """Tokens [seq_len + 1] (inputs plus the shifted target) of the sample with this global index."""


class SyntheticTokens:
    """A learnable stream: the next token follows a hidden transition table with probability `signal`."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, signal: float) -> None:
        self.vocab_size, self.seq_len, self.seed, self.signal = vocab_size, seq_len, seed, signal
        self.table = np.random.default_rng([seed, 0]).permutation(vocab_size)

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, index])
        n = self.seq_len + 1
        noise = rng.integers(0, self.vocab_size, size=n)
        follow = rng.random(n) < self.signal
        out = np.empty(n, dtype=np.int64)
        out[0] = noise[0]
        for t in range(1, n):
            out[t] = self.table[out[t - 1]] if follow[t] else noise[t]
        return out


class MemmapTokens:
    """Windows of a flat binary file of token ids; window order shuffled per epoch by the seed."""

    def __init__(self, path: str, dtype: str, seq_len: int, seed: int, shuffle: bool) -> None:
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
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


def build_source(data_cfg: Any, vocab_size: int) -> TokenSource:
    if data_cfg.name == "synthetic":
        return SyntheticTokens(vocab_size, data_cfg.seq_len, data_cfg.seed, data_cfg.signal)
    if data_cfg.name == "tokens":
        if not data_cfg.path or not Path(data_cfg.path).is_file():
            raise FileNotFoundError(f"data.path={data_cfg.path!r} is not a file")
        return MemmapTokens(data_cfg.path, data_cfg.dtype, data_cfg.seq_len, data_cfg.seed, data_cfg.shuffle)
    raise ValueError(f"unknown data source {data_cfg.name!r}")


def micro_batch_indices(position: int, micro_step: int, dp_rank: int, dp_size: int, micro: int) -> range:
    start = position + (micro_step * dp_size + dp_rank) * micro
    return range(start, start + micro)


def load_micro_batch(source: TokenSource, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
    batch = torch.from_numpy(np.stack([source.sample(i) for i in indices]))
    return batch[:, :-1], batch[:, 1:]
