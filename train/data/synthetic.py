"""A learnable synthetic token stream (data=synthetic): deterministic by seed and global index."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
