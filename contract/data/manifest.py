"""The prepared-dataset format: one reader and one writer for both sides (stdlib + numpy, no torch).

A prepared dataset is a directory:
  manifest.json     written last, atomically; its presence means the dataset is complete
  train/NNNNN.bin   token shards of the train split: flat little-endian arrays of `dtype`
  val/NNNNN.bin     token shards of the validation split (none when val_fraction is 0)
  .parts/           per-task completion records and the preparation's plan, used to resume
A split is read as ONE token stream: its shards concatenated in the listed order, an end-of-document id after
every document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contract.atomic import write_json_atomic  # noqa: F401 (imported from here by the preparation)
from contract.errors import ConfigError

FORMAT = "slurmtrain.prepared/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")
SKIPPED_LISTED = 100  # paths listed per reason a file was skipped (the counts cover them all)
_PREPARE_HINT = "prepare it with `python -m launcher.prepare INPUTS --out DIR --tokenizer T`"


@dataclass(frozen=True)
class TokenizerInfo:
    name: str  # "bytes" or the tokenizer file/directory name
    path: str | None  # absolute path of tokenizer.json; None for bytes
    vocab_size: int
    fingerprint: str  # "sha256:..." of tokenizer.json's bytes; "bytes" for bytes


@dataclass(frozen=True)
class Shard:
    path: str  # relative to the dataset directory, e.g. "train/00000.bin"
    tokens: int
    documents: int
    sha256: str  # hex digest of the shard file's bytes
    # A supervised fine-tuning dataset's loss mask beside it (contract/data/sft.py): its digest and how many of the
    # shard's tokens are response tokens. None in a plain dataset.
    mask_sha256: str | None = None
    response_tokens: int | None = None


@dataclass(frozen=True)
class Split:
    tokens: int
    documents: int
    shards: tuple[Shard, ...] = ()

    @property
    def response_tokens(self) -> int:
        return sum(s.response_tokens or 0 for s in self.shards)


@dataclass(frozen=True)
class Source:
    path: str  # absolute path of an input file
    bytes: int
    documents: int


@dataclass(frozen=True)
class SkippedFiles:
    """The input files skipped for one reason ("binary", "not_utf8"): how many, their bytes, the first paths."""

    files: int
    bytes: int
    paths: tuple[str, ...]  # the first SKIPPED_LISTED, in input order


@dataclass(frozen=True)
class Manifest:
    tokenizer: TokenizerInfo
    dtype: str
    eod_id: int
    val_fraction: float
    split_seed: int
    splits: Mapping[str, Split]
    sources: tuple[Source, ...]
    fingerprint: str
    format: str = FORMAT
    # How the sources were chosen and read (--include, --exclude, --encoding-errors) and what was skipped; neither
    # is part of the fingerprint, which is the tokens' (other filters that choose the same files, the same data).
    selection: Mapping[str, Any] = field(default_factory=dict)
    skipped: Mapping[str, SkippedFiles] = field(default_factory=dict)
    # Supervised fine-tuning records (contract/data/sft.py): how they were read and rendered; None: plain text.
    sft: Mapping[str, Any] | None = None
    # Where the manifest was loaded from (not stored in the file): shard paths are relative to it.
    root: Path | None = field(default=None, compare=False)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    def split(self, name: str) -> Split:
        return self.splits.get(name, Split(0, 0))

    def shard_files(self, split: str) -> list[Path]:
        """The split's shard files in stream order (absolute when the manifest was loaded from a directory)."""
        root = self.root or Path(".")
        return [root / shard.path for shard in self.split(split).shards]

    def mask_files(self, split: str) -> list[Path] | None:
        """The split's loss-mask shards beside its token shards (None: not a supervised fine-tuning dataset)."""
        from contract.data.sft import mask_path

        root = self.root or Path(".")
        return None if self.sft is None else [root / mask_path(shard.path) for shard in self.split(split).shards]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tokenizer": vars(self.tokenizer).copy(),
            "dtype": self.dtype,
            "eod_id": self.eod_id,
            "val_fraction": self.val_fraction,
            "split_seed": self.split_seed,
            "splits": {name: _split_json(self.split(name)) for name in SPLITS},
            "sources": [vars(s).copy() for s in self.sources],
            "selection": dict(self.selection),
            "skipped": {
                reason: {"files": s.files, "bytes": s.bytes, "paths": list(s.paths)}
                for reason, s in self.skipped.items()
            },
            "fingerprint": self.fingerprint,
            **({} if self.sft is None else {"sft": dict(self.sft)}),
        }


def _split_json(split: Split) -> dict[str, Any]:
    return {
        "tokens": split.tokens,
        "documents": split.documents,
        "shards": [{k: v for k, v in vars(s).items() if v is not None} for s in split.shards],
    }


def dtype_for_vocab(vocab_size: int) -> str:
    """uint16 when every id fits (ids 0 .. vocab_size-1), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def dataset_fingerprint(
    tokenizer_fingerprint: str, dtype: str, eod_id: int, splits: Mapping[str, Split]
) -> str:
    """What the training side compares on resume: the tokenizer, the dtype, the end-of-document id and every
    shard's (path, tokens, sha256), in stream order. Document counts and sources do not change the tokens."""
    shards = [[s.path, s.tokens, s.sha256] + ([s.mask_sha256] if s.mask_sha256 else [])
              for name in SPLITS for s in splits.get(name, Split(0, 0)).shards]
    payload = json.dumps([tokenizer_fingerprint, dtype, eod_id, shards], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


def build_manifest(
    tokenizer: TokenizerInfo,
    eod_id: int,
    val_fraction: float,
    split_seed: int,
    shards: Mapping[str, Iterable[Shard]],
    sources: Iterable[Source],
    selection: Mapping[str, Any] | None = None,
    skipped: Iterable[tuple[str, int, str]] = (),
    sft: Mapping[str, Any] | None = None,
) -> Manifest:
    """A manifest whose split totals and fingerprint are computed from its shards, and its skipped counts from
    `skipped` ((path, bytes, reason) in input order), so that they cannot disagree."""
    splits = {}
    for name in SPLITS:
        listed = tuple(shards.get(name, ()))
        splits[name] = Split(sum(s.tokens for s in listed), sum(s.documents for s in listed), listed)
    dtype = dtype_for_vocab(tokenizer.vocab_size)
    return Manifest(
        tokenizer=tokenizer,
        dtype=dtype,
        eod_id=eod_id,
        val_fraction=val_fraction,
        split_seed=split_seed,
        splits=splits,
        sources=tuple(sources),
        fingerprint=dataset_fingerprint(tokenizer.fingerprint, dtype, eod_id, splits),
        selection=dict(selection or {}),
        skipped=_count_skipped(skipped),
        sft=sft,
    )


def _count_skipped(skipped: Iterable[tuple[str, int, str]]) -> dict[str, SkippedFiles]:
    counts: dict[str, tuple[int, int, list[str]]] = {}
    for path, size, reason in skipped:
        files, total, paths = counts.get(reason, (0, 0, []))
        if len(paths) < SKIPPED_LISTED:
            paths.append(path)
        counts[reason] = (files + 1, total + size, paths)
    return {reason: SkippedFiles(f, b, tuple(p)) for reason, (f, b, p) in counts.items()}


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write DIR/manifest.json atomically; written last, it marks the dataset complete."""
    path = Path(directory) / MANIFEST
    write_json_atomic(path, manifest.to_json())
    return path


def is_prepared_dir(path: str | Path) -> bool:
    """True when `path` is a directory holding a manifest.json (a complete prepared dataset)."""
    return (Path(path) / MANIFEST).is_file()


def load_manifest(directory: str | Path, check_files: bool = True) -> Manifest:
    """Read DIR/manifest.json. Raises ConfigError (one line naming the fix) when DIR is not a prepared dataset,
    the manifest is damaged, or (check_files) a listed shard is missing or has the wrong size."""
    root = Path(directory).expanduser()
    path = root / MANIFEST
    if not root.is_dir():
        raise ConfigError(f"{root} is not a prepared dataset (no such directory): {_PREPARE_HINT}")
    if not path.is_file():
        raise ConfigError(
            f"{root} is not a prepared dataset (no {MANIFEST}; an unfinished preparation resumes "
            f"when its command is run again): {_PREPARE_HINT}"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        manifest = _parse(raw, root)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{path} is damaged ({_reason(err)}): prepare the dataset again with its "
            f"`python -m launcher.prepare` command and --overwrite"
        ) from None
    if check_files:
        from contract.data.shard_files import check_shard_files

        check_shard_files(manifest, path)
    return manifest


def _reason(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"missing key {err}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}, not a count")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {value!r}, not a string")
    return value


def _parse(raw: Any, root: Path) -> Manifest:
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    if raw.get("format") != FORMAT:
        raise ValueError(f"format is {raw.get('format')!r}, this version reads {FORMAT!r}")
    tok = raw["tokenizer"]
    tokenizer = TokenizerInfo(
        name=_str(tok["name"], "tokenizer.name"),
        path=None if tok.get("path") is None else _str(tok["path"], "tokenizer.path"),
        vocab_size=_int(tok["vocab_size"], "tokenizer.vocab_size"),
        fingerprint=_str(tok["fingerprint"], "tokenizer.fingerprint"),
    )
    dtype = raw["dtype"]
    if dtype not in DTYPES:
        raise ValueError(f"dtype is {dtype!r}, not one of {', '.join(DTYPES)}")
    eod_id = _int(raw["eod_id"], "eod_id")
    if eod_id >= tokenizer.vocab_size:
        raise ValueError(f"eod_id {eod_id} is outside the vocabulary of {tokenizer.vocab_size}")
    splits = {}
    for name, split in raw["splits"].items():
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}")
        shards = tuple(
            Shard(
                _str(s["path"], "shard path"),
                _int(s["tokens"], "shard tokens"),
                _int(s["documents"], "shard documents"),
                _str(s["sha256"], "shard sha256"),
                None if s.get("mask_sha256") is None else _str(s["mask_sha256"], "shard mask_sha256"),
                None if s.get("response_tokens") is None else _int(s["response_tokens"], "shard response_tokens"),
            )
            for s in split["shards"]
        )
        splits[name] = Split(
            _int(split["tokens"], f"{name}.tokens"), _int(split["documents"], f"{name}.documents"), shards
        )
        if splits[name].tokens != sum(s.tokens for s in shards):
            raise ValueError(f"{name}.tokens does not equal the sum of its shards' tokens")
    sources = tuple(
        Source(
            _str(s["path"], "source path"),
            _int(s["bytes"], "source bytes"),
            _int(s["documents"], "source documents"),
        )
        for s in raw["sources"]
    )
    fingerprint = _str(raw["fingerprint"], "fingerprint")
    if fingerprint != dataset_fingerprint(tokenizer.fingerprint, dtype, eod_id, splits):
        raise ValueError("its fingerprint does not match its shards")
    selection = raw.get("selection", {})  # absent from manifests written before --include/--exclude
    if not isinstance(selection, dict):
        raise ValueError(f"selection is {selection!r}, not an object")
    skipped = {
        _str(reason, "skipped reason"): SkippedFiles(
            _int(s["files"], "skipped files"),
            _int(s["bytes"], "skipped bytes"),
            tuple(_str(p, "skipped path") for p in s["paths"]),
        )
        for reason, s in raw.get("skipped", {}).items()
    }
    return Manifest(
        tokenizer=tokenizer,
        dtype=dtype,
        eod_id=eod_id,
        val_fraction=float(raw["val_fraction"]),
        split_seed=int(raw["split_seed"]),
        splits=splits,
        sources=sources,
        fingerprint=fingerprint,
        selection=selection,
        skipped=skipped,
        sft=raw.get("sft"),
        root=root,
    )
