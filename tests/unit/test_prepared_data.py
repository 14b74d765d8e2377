"""Training reads prepared datasets (contract/data/spec.py, windows.py, prepared.py): data.path at a prepared
directory reads its train split's shards as one stream (windows across shard boundaries equal the concatenated
stream), with the manifest's dtype; a glob of token files reads the same way; the validation split is a source of
its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from contract.data.spec import token_sources
from contract.errors import ConfigError
from tests.prepared_data import random_shards, write_prepared
from train.data import TokenStream, build_source
from train.data.prepared import validation_sources
from train.data.windows import stream_of

SEQ = 16


def _cfg(**data: object) -> object:
    base = {"name": "tokens", "path": None, "dtype": "uint16", "seq_len": SEQ, "seed": 5, "shuffle": True,
            "sources": {}, "_target_": None}
    return OmegaConf.create({**base, **data})


@pytest.mark.parametrize("vocab", [257, 70_000])  # uint16 and uint32 shards
def test_windows_across_shard_boundaries_equal_the_concatenated_stream(tmp_path: Path, vocab: int) -> None:
    # Shards of awkward lengths, one shorter than a window and one empty: windows span two and three shards.
    shards = random_shards(1, [37, 5, 0, 60, 23, 1], vocab)
    write_prepared(tmp_path, shards, val=random_shards(2, [40]), vocab=vocab)
    stream = np.concatenate(shards)
    source = build_source(_cfg(path=str(tmp_path), dtype="uint16"), vocab_size=vocab)
    windows = (len(stream) - 1) // SEQ
    assert source.windows == windows
    batch = source.sample_batch(np.arange(2 * windows))
    for i, window in enumerate(source.window_of(np.arange(2 * windows))):
        assert np.array_equal(batch[i], stream[window * SEQ : window * SEQ + SEQ + 1]), i
    assert sorted(source.window_of(np.arange(windows)).tolist()) == list(range(windows))
    for start in range(0, len(stream) - 30):  # every offset, every length across the boundaries
        assert np.array_equal(source.stream.read(start, 30), stream[start : start + 30])


def test_the_manifest_sets_the_dtype_and_a_glob_reads_files_in_order(tmp_path: Path) -> None:
    shards = random_shards(3, [50, 50, 50], 70_000)
    manifest = write_prepared(tmp_path / "prep", shards, vocab=70_000)
    assert manifest.dtype == "uint32"
    (spec,) = token_sources(_cfg(path=str(tmp_path / "prep"), dtype="uint16"))  # data.dtype is the manifest's
    assert spec.dtype == "uint32" and spec.tokens == 150 and spec.vocab_size == 70_000 and spec.eod_id == 256
    (tmp_path / "flat").mkdir()
    for i, ids in enumerate(shards):
        ids.astype(np.uint32).tofile(tmp_path / "flat" / f"part-{2 - i}.bin")  # sorted order: reversed
    (spec,) = token_sources(_cfg(path=str(tmp_path / "flat" / "part-*.bin"), dtype="uint32"))
    assert spec.kind == "glob" and [f.name for f in spec.files] == ["part-0.bin", "part-1.bin", "part-2.bin"]
    assert np.array_equal(stream_of(spec).read(0, 150), np.concatenate(shards[::-1]))


def test_the_validation_split_is_a_source_in_order(tmp_path: Path) -> None:
    val = random_shards(4, [20, 30])
    write_prepared(tmp_path, random_shards(5, [100]), val=val)
    (source,) = validation_sources(_cfg(path=str(tmp_path))).values()
    stream = np.concatenate(val)
    assert source.windows == (50 - 1) // SEQ
    assert [int(w) for w in source.window_of(range(4))] == [0, 1, 2, 0]  # in order, wrapping
    assert np.array_equal(source.sample(1), stream[SEQ : 2 * SEQ + 1])
    write_prepared(tmp_path / "noval", random_shards(6, [100]))
    assert validation_sources(_cfg(path=str(tmp_path / "noval"))) == {}


def test_what_a_path_names_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cases = {str(tmp_path / "empty"): "is not a regular file nor a prepared dataset (no manifest.json)",
             str(tmp_path / "none-*.bin"): "matches no file",
             str(tmp_path / "gone.bin"): "does not exist: point data.path at a token file, a prepared directory"}
    for path, expected in cases.items():
        with pytest.raises(ConfigError, match="^data.path=.*" + expected.replace("(", r"\(").replace(")", r"\)")):
            token_sources(_cfg(path=path))
    with pytest.raises(ConfigError, match=r"is not a file here \(was it moved after submitting\?\)"):
        token_sources(_cfg(path=str(tmp_path / "gone.bin")), on_ranks=True)


def test_a_stream_reads_what_numpy_wrote(tmp_path: Path) -> None:
    ids = np.arange(1000, dtype=np.uint16)
    ids.tofile(tmp_path / "a.bin")
    stream = TokenStream([tmp_path / "a.bin"], "uint16")
    assert stream.total == 1000 and stream.read(998, 2).tolist() == [998, 999]
    with pytest.raises(IndexError):
        stream.read(999, 2)
