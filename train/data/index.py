"""The order of items within an epoch: a keyed bijection on [0, n), computed per index, never materialised.

`EpochOrder(n, key)` maps a position (any epoch: position p is item order(p mod n) of epoch p // n) to an item.
Each epoch's order is a Feistel network over the smallest power of two >= n, keyed by (key, epoch), restricted to
[0, n) by cycle-walking (apply it again until the value falls inside; a permutation of the larger domain walked
from a point inside returns inside, so the result is a permutation of [0, n)). Memory is O(1) and the cost per
index a few dozen integer operations, vectorised over a batch: a corpus of a trillion tokens opens at once and its
first batch costs what a small file's does.

INDEX_VERSION is saved with every checkpoint (train/loop.py TrainState.data_index). Version 1, before this module,
materialised a numpy permutation per epoch (4 GB per rank at a trillion tokens): a run whose checkpoint has no
version keeps that order (LegacyOrder), so it resumes on exactly the samples it would have read; new runs use
version 2.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import numpy as np

INDEX_VERSION = 2
LEGACY_INDEX_VERSION = 1
ROUNDS = 6


class Order(Protocol):
    size: int

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The item (in [0, size)) at each position; positions past `size` are later epochs."""


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of x + key (uint64 arithmetic wraps): the Feistel round function."""
    z = x + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def round_keys(key: str, epoch: int) -> list[np.uint64]:
    digest = hashlib.blake2b(f"{key}/{epoch}".encode(), digest_size=8 * ROUNDS).digest()
    return [np.uint64(int.from_bytes(digest[8 * r : 8 * r + 8], "little")) for r in range(ROUNDS)]


class FeistelPermutation:
    """A keyed permutation of [0, n): an unbalanced Feistel network on `bits` bits with cycle-walking."""

    def __init__(self, n: int, keys: list[np.uint64]) -> None:
        if n < 1:
            raise ValueError(f"a permutation of {n} items")
        self.n, self.keys = n, keys
        self.bits = max(1, (n - 1).bit_length())
        # The halves alternate between these widths (left `a` bits, right `b` bits, then swapped), so the domain
        # is exactly 2**bits < 2n: cycle-walking takes under two passes on average.
        self.a = self.bits // 2
        self.b = self.bits - self.a

    def _once(self, x: np.ndarray) -> np.ndarray:
        left_bits, right_bits = self.a, self.b
        for key in self.keys:
            right_mask = np.uint64((1 << right_bits) - 1)
            left = x >> np.uint64(right_bits)
            right = x & right_mask
            new_right = left ^ (_mix(right, key) & np.uint64((1 << left_bits) - 1))
            x = (right << np.uint64(left_bits)) | new_right
            left_bits, right_bits = right_bits, left_bits
        return x

    def __call__(self, offsets: np.ndarray) -> np.ndarray:
        x = np.asarray(offsets, dtype=np.uint64)
        if self.n == 1:
            return np.zeros_like(x)
        x = self._once(x)
        outside = x >= self.n
        while outside.any():
            x[outside] = self._once(x[outside])
            outside = x >= self.n
        return x


class EpochOrder:
    """Items of [0, size) shuffled per epoch by a bijection keyed by (key, epoch); `shuffle=False`: in order."""

    def __init__(self, size: int, key: str, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError(f"an order of {size} items")
        self.size, self.key, self.shuffle = size, key, shuffle
        self._epochs: dict[int, FeistelPermutation] = {}

    def _permutation(self, epoch: int) -> FeistelPermutation:
        if epoch not in self._epochs:
            if len(self._epochs) > 4:  # a batch spans one or two epochs: keep a few
                self._epochs.clear()
            self._epochs[epoch] = FeistelPermutation(self.size, round_keys(self.key, epoch))
        return self._epochs[epoch]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.size)
        if not self.shuffle:
            return offsets
        out = np.empty_like(offsets)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = self._permutation(int(epoch))(offsets[here]).astype(np.int64)
        return out


class LegacyOrder:
    """Index version 1: numpy's permutation of the whole epoch, seeded by [seed, salt, epoch] (salt 2 for token
    windows, 3 for a user's dataset), held for the current epoch. Only for runs resumed from such checkpoints."""

    def __init__(self, size: int, seed: int, salt: int, shuffle: bool = True) -> None:
        self.size, self.seed, self.salt, self.shuffle = size, seed, salt, shuffle
        self._order: dict[int, np.ndarray] = {}

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        epochs, offsets = np.divmod(np.asarray(positions, dtype=np.int64), self.size)
        if not self.shuffle:
            return offsets
        out = np.empty_like(offsets)
        for i, (epoch, offset) in enumerate(zip(epochs.tolist(), offsets.tolist(), strict=True)):
            if epoch not in self._order:
                self._order = {epoch: np.random.default_rng([self.seed, self.salt, epoch]).permutation(self.size)}
            out[i] = self._order[epoch][offset]
        return out


def epoch_order(size: int, seed: int, salt: int, name: str = "", shuffle: bool = True,
                version: int = INDEX_VERSION) -> Order:
    """The order of `size` items for this seed: `salt` tells streams of one seed apart (2: token windows, 3: a
    user's dataset), `name` the sources of a mixture."""
    if version == LEGACY_INDEX_VERSION:
        return LegacyOrder(size, seed, salt, shuffle)
    if version != INDEX_VERSION:
        raise ValueError(f"data index version {version} is newer than this slurmtrain ({INDEX_VERSION}): upgrade "
                         "slurmtrain to resume this checkpoint")
    return EpochOrder(size, f"{seed}/{salt}/{name}", shuffle)
