"""python -m launcher.prepare: corpus -> token shards + manifest (issue 20)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from launcher.errors import ConfigError
from launcher.prepare import manifest as mf

# ---------------------------------------------------------------- the format (launcher/prepare/manifest.py)


def _write_dataset(root: Path, train: list[list[int]], val: list[list[int]], vocab: int = 257) -> mf.Manifest:
    tok = mf.TokenizerInfo("bytes", None, vocab, "bytes")
    dtype = mf.dtype_for_vocab(vocab)
    shards: dict[str, list[mf.Shard]] = {}
    for split, arrays in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i, ids in enumerate(arrays):
            data = np.asarray(ids, dtype=dtype).tobytes()
            rel = f"{split}/{i:05d}.bin"
            (root / rel).write_bytes(data)
            shards.setdefault(split, []).append(mf.Shard(rel, len(ids), 1, hashlib.sha256(data).hexdigest()))
    manifest = mf.build_manifest(tok, 256, 0.1, 3, shards, [mf.Source("/in/a.txt", 10, 2)])
    mf.write_manifest(root, manifest)
    return manifest


def test_manifest_round_trip(tmp_path: Path) -> None:
    written = _write_dataset(tmp_path, [[1, 2, 256], [3, 256]], [[4, 4, 256]])
    assert mf.is_prepared_dir(tmp_path) and not mf.is_prepared_dir(tmp_path / "train")
    loaded = mf.load_manifest(tmp_path)
    assert loaded == written
    assert (
        loaded.dtype == "uint16" and loaded.split("train").tokens == 5 and loaded.split("val").documents == 1
    )
    stream = np.concatenate([np.fromfile(f, dtype=loaded.np_dtype) for f in loaded.shard_files("train")])
    assert stream.tolist() == [1, 2, 256, 3, 256]
    assert json.loads((tmp_path / mf.MANIFEST).read_text())["format"] == mf.FORMAT
    assert not list(tmp_path.glob("*.tmp*"))


def test_dtype_follows_the_vocabulary() -> None:
    assert mf.dtype_for_vocab(257) == "uint16" and mf.dtype_for_vocab(65536) == "uint16"
    assert mf.dtype_for_vocab(65537) == "uint32"


def test_fingerprint_changes_with_any_shard(tmp_path: Path) -> None:
    a = _write_dataset(tmp_path / "a", [[1, 256]], [])
    b = _write_dataset(tmp_path / "b", [[2, 256]], [])
    c = _write_dataset(tmp_path / "c", [[1, 256]], [])
    assert a.fingerprint == c.fingerprint != b.fingerprint


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda root: (root / mf.MANIFEST).unlink(), "no manifest.json"),
        (lambda root: (root / mf.MANIFEST).write_text("{"), "is damaged"),
        (
            lambda root: (root / mf.MANIFEST).write_text(
                (root / mf.MANIFEST).read_text().replace('"tokens": 3', '"tokens": 4', 1)
            ),
            "is damaged",
        ),
        (lambda root: (root / "train/00000.bin").unlink(), "which is missing"),
        (lambda root: (root / "train/00000.bin").write_bytes(b"\0"), "holds 1 bytes"),
    ],
)
def test_load_manifest_refuses_what_is_not_a_dataset(tmp_path: Path, damage, words: str) -> None:
    _write_dataset(tmp_path, [[1, 2, 256]], [])
    damage(tmp_path)
    with pytest.raises(ConfigError, match=words) as err:
        mf.load_manifest(tmp_path)
    assert "\n" not in str(err.value) and "launcher.prepare" in str(err.value)
