"""Prepared datasets for tests, written through contract/data/manifest.py (the one writer of the format)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract.data import manifest as mf


def write_prepared(root: Path, train: Sequence[Sequence[int]], val: Sequence[Sequence[int]] = (),
                   vocab: int = 257, tokenizer: str = "bytes", eod_id: int = 256,
                   tokenizer_file: Path | None = None) -> mf.Manifest:
    """A prepared dataset at `root`: one shard per list of ids in each split, a tokenizer named `tokenizer` (with
    `tokenizer_file`: that tokenizer.json, by path and sha256, as launcher.prepare records one)."""
    fingerprint = tokenizer if tokenizer == "bytes" else f"sha256:{tokenizer}"
    if tokenizer_file is not None:
        fingerprint = "sha256:" + hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
    info = mf.TokenizerInfo(tokenizer, None if tokenizer_file is None else str(tokenizer_file), vocab, fingerprint)
    dtype = mf.dtype_for_vocab(vocab)
    shards: dict[str, list[mf.Shard]] = {}
    for split, arrays in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i, ids in enumerate(arrays):
            data = np.asarray(ids, dtype=dtype).tobytes()
            rel = f"{split}/{i:05d}.bin"
            (root / rel).write_bytes(data)
            shards.setdefault(split, []).append(mf.Shard(rel, len(ids), 1, hashlib.sha256(data).hexdigest()))
    manifest = mf.build_manifest(info, eod_id, 0.1, 0, shards, [mf.Source(str(root / "input.txt"), 1, 1)])
    mf.write_manifest(root, manifest)
    return manifest


def random_shards(seed: int, lengths: Sequence[int], vocab: int = 256) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n) for n in lengths]


def random_documents(seed: int, tokens: int, eod: int = 256) -> list[int]:
    """`tokens` ids of documents of 5 to 40 byte ids, each followed by the end-of-document id, as launcher.prepare
    writes them (the last one cut)."""
    rng, out = np.random.default_rng(seed), []
    while len(out) < tokens:
        out += [*rng.integers(0, 256, int(rng.integers(5, 40))).tolist(), eod]
    return out[:tokens]
