from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from train.data import MemmapTokens, SyntheticTokens, micro_batch_indices
from train.optim import lr_factor


def test_synthetic_stream_is_deterministic_and_learnable() -> None:
    a, b = SyntheticTokens(64, 32, seed=7, signal=0.9), SyntheticTokens(64, 32, seed=7, signal=0.9)
    assert np.array_equal(a.sample(5), b.sample(5))
    assert not np.array_equal(a.sample(5), a.sample(6))
    assert not np.array_equal(a.sample(5), SyntheticTokens(64, 32, seed=8, signal=0.9).sample(5))
    follows = np.mean([np.mean(a.table[s[:-1]] == s[1:]) for s in (a.sample(i) for i in range(200))])
    assert 0.85 < follows < 0.95


def test_rank_shards_are_disjoint_and_cover_the_global_batch() -> None:
    micro, dp, accum, position = 4, 3, 2, 96
    seen = [i for m in range(accum) for r in range(dp) for i in micro_batch_indices(position, m, r, dp, micro)]
    assert sorted(seen) == list(range(position, position + micro * dp * accum))


def test_same_position_same_samples_whatever_the_world_size() -> None:
    # 2 ranks x micro 4 and 1 rank x micro 4 x accumulation 2 consume the same global samples per step.
    two = sorted(i for r in range(2) for i in micro_batch_indices(16, 0, r, 2, 4))
    one = sorted(i for m in range(2) for i in micro_batch_indices(16, m, 0, 1, 4))
    assert two == one


def test_memmap_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    src = MemmapTokens(str(path), "uint16", seq_len=10, seed=0, shuffle=False)
    assert src.windows == 99
    assert src.sample(3).tolist() == list(range(30, 41))
    shuffled = MemmapTokens(str(path), "uint16", seq_len=10, seed=0, shuffle=True)
    starts = sorted(int(shuffled.sample(i)[0]) for i in range(99))
    assert starts == list(range(0, 990, 10))  # a permutation of all windows in one epoch


@pytest.mark.parametrize("warmup", [0, 5])
def test_lr_schedule_warmup_then_cosine(warmup: int) -> None:
    f = [lr_factor(s, warmup, 100, 0.1) for s in range(100)]
    if warmup:
        assert f[0] == pytest.approx(1 / warmup) and f[warmup - 1] == pytest.approx(1.0)
    assert f[warmup] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(f[warmup:], f[warmup + 1 :], strict=False))
    assert lr_factor(100, warmup, 100, 0.1) == pytest.approx(0.1)
