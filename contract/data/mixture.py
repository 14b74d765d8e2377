"""A mixture of token sources by weight (data.sources.NAME.path / .weight): which source and which window global
sample i reads is a pure function of i, the weights and the seed, so any resume on any number of ranks continues
exactly, and the share of each source over any run of consecutive samples stays at its weight.

The samples come in blocks of BLOCK. Each block holds the largest-remainder apportionment of BLOCK by the weights
(count c_s for source s), in one fixed order: Megatron's "largest sampling error first" greedy (position j goes to
the source furthest behind its share c_s * (j + 1) / BLOCK, ties to the first in name order), which keeps every
source within one sample of its share at every prefix of a block. So over any W consecutive samples a source's
count is within 2 + W / BLOCK of W x its weight: within 0.0003 of the weight over 10,000 samples (independent
random draws per sample would stray by about 0.005, and further at times).

Sample i: block b = i // BLOCK, position p = i % BLOCK; source order[p], its ordinal b * c_s + rank[p] (the
samples it gave before). The source then maps its ordinal to a window with its own epoch order (index.py, keyed
by the seed and the source's name), so each source is read in epochs of its own. Torch-free (the launch plan
uses the same arithmetic to say how many epochs of each source a run reads).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

BLOCK = 10_000


def apportion(weights: Sequence[float], total: int) -> np.ndarray:
    """Largest-remainder apportionment of `total` by `weights` (normalised here); ties to the first."""
    w = np.asarray(weights, dtype=np.float64)
    quotas = w / w.sum() * total
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        order = sorted(range(len(w)), key=lambda s: (-(quotas[s] - counts[s]), s))
        counts[order[:short]] += 1
    return counts


@functools.lru_cache(maxsize=8)
def _block(counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source of each position, its ordinal within the block, samples of each source before each position)."""
    block = sum(counts)
    c = np.asarray(counts, dtype=np.int64)
    taken = np.zeros(len(c), dtype=np.int64)
    order = np.empty(block, dtype=np.int32)
    rank = np.empty(block, dtype=np.int64)
    for j in range(block):
        # The error of each source's count after this position, in units of 1 / block (exact integers).
        s = int(np.argmax(c * (j + 1) - taken * block))
        order[j], rank[j] = s, taken[s]
        taken[s] += 1
    before = np.zeros((block + 1, len(c)), dtype=np.int64)
    before[1:] = np.cumsum(np.eye(len(c), dtype=np.int64)[order], axis=0)
    return order, rank, before


class MixtureSchedule:
    """The source and the source's ordinal of each global sample index, for these weights."""

    def __init__(self, weights: Sequence[float], block: int = BLOCK) -> None:
        self.counts = apportion(weights, block)
        self.block = block
        self.order, self.rank, self.before = _block(tuple(int(c) for c in self.counts))

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        blocks, positions = np.divmod(np.asarray(indices, dtype=np.int64), self.block)
        sources = self.order[positions]
        return sources, blocks * self.counts[sources] + self.rank[positions]

    def consumed(self, samples: int) -> np.ndarray:
        """How many of the first `samples` global samples each source gave."""
        blocks, position = divmod(int(samples), self.block)
        return blocks * self.counts + self.before[position]


class Mixture:
    """A TokenSource over named window sources (train/data/windows.py WindowSource) mixed by weight."""

    def __init__(self, sources: Mapping[str, object], weights: Mapping[str, float]) -> None:
        self.names = list(sources)
        self.sources = [sources[name] for name in self.names]
        self.schedule = MixtureSchedule([weights[name] for name in self.names])
        self.seq_len = int(self.sources[0].seq_len)  # type: ignore[attr-defined]

    def sample(self, index: int) -> np.ndarray:
        return self.sample_batch([index])[0]

    def sample_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return self._gather("sample_batch", indices, self.seq_len + 1, np.int64)

    def document_ids(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Each input token's document within its sample (data.document_mask), from the sample's own source."""
        return self._gather("document_ids", indices, self.seq_len, np.int32)

    def _gather(self, method: str, indices: Sequence[int] | np.ndarray, width: int, dtype: type) -> np.ndarray:
        which, ordinals = self.schedule.locate(indices)
        out: np.ndarray = np.empty((len(which), width), dtype=dtype)
        for s in np.unique(which):
            rows = which == s
            out[rows] = getattr(self.sources[int(s)], method)(ordinals[rows])
        return out

    def progress(self, samples: int) -> dict[str, dict[str, float]]:
        """For metrics.jsonl: tokens each source gave in the first `samples` samples, and its epoch (1.5: half-way
        through its second pass)."""
        counts = self.schedule.consumed(samples)
        return {"tokens_by_source": {name: int(n) * self.seq_len for name, n in zip(self.names, counts, strict=True)},
                "epoch_by_source": {name: round(int(n) / source.windows, 6)  # type: ignore[attr-defined]
                                    for name, n, source in zip(self.names, counts, self.sources, strict=True)}}


def samples_per_source(weights: Sequence[float], samples: int) -> list[int]:
    """How many of the first `samples` samples each source gives (the launch plan's epochs)."""
    return [int(n) for n in MixtureSchedule(weights).consumed(samples)]
