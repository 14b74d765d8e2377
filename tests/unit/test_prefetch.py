"""Vectorised synthetic batches are bitwise the per-sample stream; the prefetcher hands out exactly the batches
asked for, raises the source's errors where they belong, and stops at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from train.data import (
    SyntheticTokens,
    load_micro_batch,
    micro_batch_indices,
    planned_micro_batches,
    split_sample,
)
from train.data.prefetch import BatchPrefetcher


def per_sample_loop(src: SyntheticTokens, index: int) -> np.ndarray:
    """SyntheticTokens.sample as it was before batching (one token at a time): the reference every existing run
    and checkpoint was made with."""
    rng = np.random.default_rng([src.seed, 1, index])
    n = src.seq_len + 1
    noise = rng.integers(0, src.vocab_size, size=n)
    follow = rng.random(n) < src.signal
    out = np.empty(n, dtype=np.int64)
    out[0] = noise[0]
    for t in range(1, n):
        out[t] = src.table[out[t - 1]] if follow[t] else noise[t]
    return out


@pytest.mark.parametrize(("vocab", "seq_len", "seed", "signal"),
                         [(256, 64, 1234, 0.9), (50257, 256, 7, 0.9), (64, 32, 3, 0.0), (300, 128, 5, 1.0),
                          (17, 1, 0, 0.5)])
def test_batched_synthetic_stream_is_bitwise_the_per_sample_one(vocab: int, seq_len: int, seed: int,
                                                                 signal: float) -> None:
    src = SyntheticTokens(vocab, seq_len, seed, signal)
    # Many indices, including far ones and micro batches that are not contiguous ranges.
    groups = [range(0, 64), range(10_000, 10_037), [3, 999_983, 7, 2**40 + 1], range(123_456, 123_457)]
    for indices in groups:
        batch = src.sample_batch(indices)
        reference = np.stack([per_sample_loop(src, i) for i in indices])
        assert batch.dtype == reference.dtype == np.int64
        assert np.array_equal(batch, reference)
        for i in list(indices)[:3]:
            assert np.array_equal(src.sample(i), reference[list(indices).index(i)])


def test_batched_micro_batch_tensors_equal_the_stacked_samples() -> None:
    src = SyntheticTokens(256, 64, 1234, 0.9)
    inputs, targets = load_micro_batch(src, range(40, 48))
    pairs = [split_sample(per_sample_loop(src, i)) for i in range(40, 48)]
    assert torch.equal(inputs, torch.stack([p[0] for p in pairs]))
    assert torch.equal(targets, torch.stack([p[1] for p in pairs]))
    assert inputs.is_contiguous() and targets.is_contiguous() and inputs.dtype == torch.int64


def test_plan_walks_the_indices_train_step_asks_for() -> None:
    plan = list(planned_micro_batches(96, steps=3, accum=2, dp_rank=1, dp_size=2, micro=4))
    asked = [micro_batch_indices(96 + step * 16, m, 1, 2, 4) for step in range(3) for m in range(2)]
    assert plan == asked


def _prefetcher(src: object, plan: list[range], depth: int = 2) -> BatchPrefetcher:
    return BatchPrefetcher(src, torch.device("cpu"), iter(plan), depth)  # type: ignore[arg-type]


def test_prefetched_batches_equal_direct_loading() -> None:
    src = SyntheticTokens(256, 16, 1, 0.9)
    plan = [range(i * 4, i * 4 + 4) for i in range(10)]
    pre = _prefetcher(src, plan)
    try:
        for indices in plan:
            got = pre.get(indices)
            want = load_micro_batch(src, indices)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    finally:
        pre.close()
    assert not pre.alive


def test_asking_for_other_samples_than_planned_fails_loudly() -> None:
    pre = _prefetcher(SyntheticTokens(256, 16, 1, 0.9), [range(0, 4), range(4, 8)])
    try:
        with pytest.raises(RuntimeError, match="out of step: asked for samples 8..11"):
            pre.get(range(8, 12))
    finally:
        pre.close()


class Broken:
    def sample(self, index: int) -> np.ndarray:
        if index == 5:
            raise ValueError("bad sample 5")
        return np.arange(5)


def test_a_source_error_is_raised_at_the_micro_batch_that_needs_it() -> None:
    pre = _prefetcher(Broken(), [range(0, 2), range(2, 4), range(4, 6), range(6, 8)])
    try:
        assert pre.get(range(0, 2))[0].shape == (2, 4)
        pre.get(range(2, 4))
        with pytest.raises(ValueError, match="bad sample 5"):
            pre.get(range(4, 6))
    finally:
        pre.close()


def test_close_with_a_full_queue_is_quick_drops_the_rest_and_ends_the_thread() -> None:
    src = SyntheticTokens(256, 16, 1, 0.9)
    plan = [range(i * 4, i * 4 + 4) for i in range(1000)]
    pre = _prefetcher(src, plan, depth=3)
    pre.get(plan[0])
    deadline = time.monotonic() + 10
    while pre._queue.qsize() < 3 and time.monotonic() < deadline:  # the queue fills while the "model" runs
        time.sleep(0.01)
    assert pre._thread.daemon  # never keeps a stopping process alive
    t0 = time.monotonic()
    dropped = pre.close()
    assert time.monotonic() - t0 < 1.0
    assert dropped == [list(r) for r in plan[1:4]]
    assert not pre.alive
    assert "slurmtrain-prefetch" not in [t.name for t in threading.enumerate()]
    assert pre.close() == []  # idempotent: the stop path and the final cleanup both close it
