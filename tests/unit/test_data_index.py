"""The order of windows within an epoch is a keyed bijection computed per index (train/data/index.py): a
permutation for every size, the same for the same key, another for another seed or epoch, and O(1) memory, so a
trillion-token file opens and samples without materialising anything. A run whose checkpoint predates it keeps
its old order."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from train.data import MemmapTokens, TokenStream, WindowSource
from train.data.index import INDEX_VERSION, LEGACY_INDEX_VERSION, EpochOrder, epoch_order

SIZES = [1, 2, 3, 5, 7, 8, 13, 97, 100, 127, 128, 129, 1000, 1021, 4096, 65521, 65537, 100_003]


@pytest.mark.parametrize("n", SIZES)
def test_each_epoch_is_a_permutation(n: int) -> None:
    order = EpochOrder(n, "seed/2/")
    for epoch in range(3):
        items = order(np.arange(epoch * n, (epoch + 1) * n))
        assert items.dtype == np.int64
        assert np.array_equal(np.sort(items), np.arange(n)), (n, epoch)


def test_deterministic_and_keyed_by_seed_and_epoch() -> None:
    n = 10_007
    a, b = epoch_order(n, seed=1, salt=2), epoch_order(n, seed=1, salt=2)
    first = a(np.arange(n))
    assert np.array_equal(first, b(np.arange(n)))
    assert np.array_equal(first[[5, 17, 9000]], a(np.array([5, 17, 9000])))  # per index, in any batch
    others = {
        "next epoch": a(np.arange(n, 2 * n)),
        "another seed": epoch_order(n, seed=2, salt=2)(np.arange(n)),
        "another salt": epoch_order(n, seed=1, salt=3)(np.arange(n)),
        "another source": epoch_order(n, seed=1, salt=2, name="code")(np.arange(n))}
    for what, other in others.items():
        assert np.mean(first == other) < 0.01, what  # unrelated orders agree on ~1/n of the positions
    assert not np.array_equal(first, np.arange(n))  # shuffled
    assert np.array_equal(epoch_order(n, 1, 2, shuffle=False)(np.arange(2 * n)), np.tile(np.arange(n), 2))


def test_orders_look_uniform() -> None:
    # Where item 0 lands over many keys: spread over the whole range, not clustered near where it started.
    n = 1000
    landed = [int(np.flatnonzero(epoch_order(n, seed, 2)(np.arange(n)) == 0)[0]) for seed in range(400)]
    counts = np.histogram(landed, bins=10, range=(0, n))[0]
    assert counts.min() > 15 and counts.max() < 70, counts


def test_windows_span_every_window_once_per_epoch(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    src = MemmapTokens(str(path), "uint16", seq_len=10, seed=0, shuffle=True)
    batch = src.sample_batch(np.arange(99, 2 * 99))
    assert sorted(batch[:, 0].tolist()) == list(range(0, 990, 10))
    assert np.array_equal(batch[:, 1:] - batch[:, :-1], np.ones((99, 10)))  # windows of consecutive tokens
    assert np.array_equal(src.sample(150), batch[150 - 99])


def test_a_checkpoint_without_an_index_version_keeps_the_old_order(tmp_path: Path) -> None:
    from train.loop import restore

    path = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint16).tofile(path)
    windows = (5000 - 1) // 16
    # What data.py's MemmapTokens read before index.py: numpy's permutation of the epoch, seeded [seed, 2, epoch].
    old = [np.random.default_rng([7, 2, epoch]).permutation(windows) for epoch in range(2)]
    legacy = MemmapTokens(str(path), "uint16", seq_len=16, seed=7, shuffle=True, index_version=LEGACY_INDEX_VERSION)
    for i in (0, 5, windows - 1, windows, windows + 44):
        epoch, offset = divmod(i, windows)
        assert legacy.sample(i)[0] == old[epoch][offset] * 16

    class Saved:  # a checkpoint written before TrainState had data_index
        run_dir = tmp_path

        def latest(self) -> SimpleNamespace:
            return SimpleNamespace(path=tmp_path / "step_4", step=4)

        def load(self, _: object) -> dict:
            return {"step": 4, "samples": 64, "tokens": 1024, "wandb_id": None}

    cfg = OmegaConf.create({"run": {"resume": True}, "data": {"name": "tokens", "path": str(path), "_target_": None,
                                                              "dtype": "uint16", "allow_changed": False}})
    state = restore(Saved(), cfg, SimpleNamespace(is_main=False))  # type: ignore[arg-type]
    assert state.data_index == LEGACY_INDEX_VERSION
    assert MemmapTokens(str(path), "uint16", 16, 7, True).order.__class__ is EpochOrder
    assert INDEX_VERSION > LEGACY_INDEX_VERSION
    with pytest.raises(ValueError, match="upgrade slurmtrain"):
        epoch_order(10, 1, 2, version=INDEX_VERSION + 1)


def test_a_trillion_token_file_opens_and_samples_in_constant_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(2 * 10**12)  # one trillion uint16 tokens, sparse: no disk used
    tracemalloc.start()
    try:
        src = WindowSource(TokenStream([path], "uint16"), seq_len=2048, seed=3, shuffle=True)
        batch = src.sample_batch(np.arange(10**9, 10**9 + 64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert src.windows == (10**12 - 1) // 2048
    assert batch.shape == (64, 2049)
    # The batch itself is 1 MB (int64); the old per-epoch permutation alone was 3.9 GB.
    assert peak < 8 * 2**20, peak
