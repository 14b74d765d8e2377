"""A mixture of sources (contract/data/mixture.py): the share of each source over ANY 10,000 consecutive samples is
within 0.01 of its weight, which source and window a sample reads is a pure function of its index, each source is
read in epochs of its own, and bad mixtures are refused in one line (contract/data/spec.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from contract.data.mixture import BLOCK, MixtureSchedule, apportion, samples_per_source
from contract.data.spec import token_sources
from contract.errors import ConfigError
from tests.prepared_data import random_shards, write_prepared
from train.data import build_source, data_progress
from train.observe.metrics import wandb_values

WEIGHT_SETS = [[0.7, 0.3], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.25, 0.125, 0.0625, 0.0625], [0.999, 0.001],
               [0.01, 0.02, 0.97], [0.2, 0.0, 0.8]]


def _cfg(**data: object) -> object:
    base = {"name": "tokens", "path": None, "dtype": "uint16", "seq_len": 16, "seed": 5, "shuffle": True,
            "sources": {}, "_target_": None}
    return OmegaConf.create({**base, **data})


@pytest.mark.parametrize("weights", WEIGHT_SETS + [list(np.random.default_rng(k).random(6) ** 3) for k in range(4)])
def test_the_share_over_any_10000_samples_is_within_001_of_the_weight(weights: list[float]) -> None:
    w = np.asarray(weights) / sum(weights)
    schedule = MixtureSchedule(weights)
    rng = np.random.default_rng(0)
    # Windows anywhere, across block boundaries, far into the run; and every window start of the first blocks.
    starts = np.concatenate([rng.integers(0, 10**12, 300), np.arange(0, 3 * BLOCK, 97)])
    worst = 0.0
    for start in starts:
        sources, _ = schedule.locate(np.arange(start, start + 10_000))
        share = np.bincount(sources, minlength=len(w)) / 10_000
        worst = max(worst, float(np.abs(share - w).max()))
    assert worst <= 0.01
    assert worst <= 0.0005  # what the blocks actually give: about 2 samples in 10,000


def test_apportion_is_largest_remainder() -> None:
    assert apportion([0.7, 0.3], 10).tolist() == [7, 3]
    assert apportion([1, 1, 1], 10).tolist() == [4, 3, 3]  # ties to the first
    assert apportion([0.26, 0.37, 0.37], 100).tolist() == [26, 37, 37]
    counts = apportion([0.123, 0.456, 0.421], BLOCK)
    assert counts.sum() == BLOCK and np.abs(counts - np.array([0.123, 0.456, 0.421]) * BLOCK).max() < 1


def test_each_source_ordinal_is_read_once_in_order_and_counted() -> None:
    schedule = MixtureSchedule([0.5, 0.2, 0.3])
    n = 2 * BLOCK + 777
    sources, ordinals = schedule.locate(np.arange(n))
    for s in range(3):  # source s gives its samples 0, 1, 2, ... in index order
        assert np.array_equal(ordinals[sources == s], np.arange(np.sum(sources == s)))
    for samples in (0, 1, 999, BLOCK, n):
        assert schedule.consumed(samples).tolist() == np.bincount(sources[:samples], minlength=3).tolist()
    assert samples_per_source([0.5, 0.2, 0.3], n) == schedule.consumed(n).tolist()


def _mixture(tmp: Path, weights: dict[str, float]) -> object:
    write_prepared(tmp / "a", random_shards(0, [700, 500]))
    write_prepared(tmp / "b", random_shards(1, [300]))
    (tmp / "c.bin").write_bytes(np.arange(2000, dtype=np.uint16).tobytes())
    paths = {"a": tmp / "a", "b": tmp / "b", "c": tmp / "c.bin"}
    return _cfg(sources={name: {"path": str(paths[name]), "weight": w} for name, w in weights.items()})


def test_a_sample_is_a_pure_function_of_its_index(tmp_path: Path) -> None:
    cfg = _mixture(tmp_path, {"a": 0.5, "b": 0.2, "c": 0.3})
    first, second = build_source(cfg, 257), build_source(cfg, 257)
    indices = np.arange(5_000, 5_600)
    whole = first.sample_batch(indices)
    assert np.array_equal(whole, second.sample_batch(indices))
    shuffled = np.random.default_rng(3).permutation(indices)  # in any batch, in any order, one at a time
    assert np.array_equal(second.sample_batch(shuffled), whole[shuffled - 5_000])
    assert np.array_equal(second.sample(5_123), whole[123])
    typed_otherwise = _cfg(sources={k: cfg.sources[k] for k in ("c", "b", "a")})  # sources are sorted by name
    assert np.array_equal(build_source(typed_otherwise, 257).sample_batch(indices), whole)
    reseeded = _cfg(sources=cfg.sources, seed=6)
    assert not np.array_equal(build_source(reseeded, 257).sample_batch(indices), whole)


def test_each_source_is_read_in_epochs_of_its_own(tmp_path: Path) -> None:
    cfg = _mixture(tmp_path, {"a": 0.5, "b": 0.5})
    source = build_source(cfg, 257)
    b_windows = (300 - 1) // 16
    sources, ordinals = source.schedule.locate(np.arange(2 * 2 * b_windows))
    b = source.sources[1]
    windows = b.window_of(ordinals[sources == 1])
    assert sorted(windows[:b_windows].tolist()) == list(range(b_windows))  # every window once per epoch
    assert sorted(windows[b_windows:].tolist()) == list(range(b_windows))
    assert not np.array_equal(windows[:b_windows], windows[b_windows:])  # each epoch in another order
    progress = data_progress(source, 2 * 2 * b_windows)
    assert progress == {"tokens_by_source": {"a": 2 * b_windows * 16, "b": 2 * b_windows * 16},
                        "epoch_by_source": {"a": round(2 * b_windows / ((1200 - 1) // 16), 6), "b": 2.0}}
    assert wandb_values(progress) == {"tokens_by_source/a": 2 * b_windows * 16, "tokens_by_source/b": 2 * b_windows
                                      * 16, "epoch_by_source/a": progress["epoch_by_source"]["a"],
                                      "epoch_by_source/b": 2.0}
    single = build_source(_cfg(path=str(tmp_path / "c.bin")), 257)
    assert data_progress(single, 310) == {"epoch": 2.5}  # (2000 - 1) // 16 = 124 windows


def test_bad_mixtures_are_refused_in_one_line(tmp_path: Path) -> None:
    good = _mixture(tmp_path, {"a": 1, "b": 1}).sources
    write_prepared(tmp_path / "other", random_shards(2, [400]), vocab=300, tokenizer="other")
    cases = {
        "is negative: give every source a weight >= 0": {**good, "b": {"path": good.b.path, "weight": -0.5}},
        r"weights are all zero \(a, b\): give at least one source": {k: {"path": v.path, "weight": 0}
                                                                     for k, v in good.items()},
        "data.sources.b.weight=heavy is not a number": {**good, "b": {"path": good.b.path, "weight": "heavy"}},
        r"data.sources.b has no path: add data.sources.b.path=": {**good, "b": {"weight": 1}},
        r"data.sources.b.wieght is not a key of a source: did you mean data.sources.b.weight\?":
            {**good, "b": {"path": good.b.path, "wieght": 2}},
        r"data.sources.b.path=\S+ does not exist: point data.sources.b.path at":
            {**good, "b": {"path": str(tmp_path / "nowhere")}},
        r"data.sources.a and data.sources.b were prepared with different tokenizers \(bytes, vocabulary 257; other, "
        r"vocabulary 300\): prepare every source": {**good, "b": {"path": str(tmp_path / "other")}},
    }
    for expected, sources in cases.items():
        with pytest.raises(ConfigError, match=expected):
            token_sources(_cfg(sources=sources))
    with pytest.raises(ConfigError, match="are both set: give one source with data.path or a mixture"):
        token_sources(_cfg(sources=good, path=good.a.path))
    specs = token_sources(_cfg(sources={"a": {"path": good.a.path, "weight": 3}, "b": {"path": good.b.path}}))
    assert [(s.name, s.weight) for s in specs] == [("a", 0.75), ("b", 0.25)]  # normalised; no weight is 1
