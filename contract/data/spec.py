"""What a data=tokens config points at, resolved: one source (data.path) or a mixture's (data.sources.NAME), each
a prepared directory, a token file or a glob of token files. Torch-free: the launcher checks and plans with the
same resolution the ranks read with.

A prepared directory (python -m launcher.prepare, contract/data/manifest.py) sets the dtype, the vocabulary and
the end-of-document id; its split's shards are one stream. A glob's files are one stream in sorted order, read
with data.dtype like a single file. A mixture's sources are sorted by name (the order they were typed in does not
change the data) and their weights normalised.
"""

from __future__ import annotations

import glob as globbing
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import ConfigError

SOURCE_KEYS = ("path", "weight")
WHERE_HINT = "a token file, a prepared directory (python -m launcher.prepare) or a shard glob"


@dataclass(frozen=True)
class SourceSpec:
    key: str  # the config key that names it: data.path or data.sources.NAME.path
    name: str  # "" for data.path; NAME for a mixture's source
    path: str  # as given
    files: tuple[Path, ...]
    sizes: tuple[int, ...]  # tokens per file
    dtype: str
    weight: float  # normalised over the sources
    manifest: Any = None  # contract.data.manifest.Manifest of a prepared directory, else None
    # Supervised fine-tuning data (contract/data/sft.py): the loss-mask shards beside `files`, the split's records,
    # and data.sft_layout (packed: windows of the stream; padded: a record a sample). None: plain tokens.
    mask_files: tuple[Path, ...] | None = None
    records: int = 0
    layout: str = "packed"

    @property
    def is_sft(self) -> bool:
        return self.mask_files is not None

    @property
    def tokens(self) -> int:
        return sum(self.sizes)

    @property
    def kind(self) -> str:
        return "prepared" if self.manifest is not None else "file" if len(self.files) == 1 else "glob"

    @property
    def vocab_size(self) -> int | None:
        return None if self.manifest is None else int(self.manifest.tokenizer.vocab_size)

    @property
    def eod_id(self) -> int | None:
        return None if self.manifest is None else int(self.manifest.eod_id)

    def windows(self, seq_len: int) -> int:
        """The samples an epoch holds: windows of seq_len + 1 tokens, or (padded) records."""
        if self.is_sft and self.layout == "padded":
            return self.records
        return max(0, (self.tokens - 1) // seq_len)


def is_glob(path: str) -> bool:
    return globbing.has_magic(path) and not Path(path).expanduser().exists()


def resolve(path: str, key: str, dtype: str, name: str = "", weight: float = 1.0, split: str = "train",
            on_ranks: bool = False, layout: str = "packed") -> SourceSpec:
    """One source: ConfigError (one line naming the fix) when there is nothing to read at `path`; `on_ranks`: the
    launch checks passed, so a path gone missing was moved since."""
    from contract.data.manifest import MANIFEST, is_prepared_dir, load_manifest

    where = Path(path).expanduser()
    if where.name == MANIFEST and where.is_file() and is_prepared_dir(where.parent):
        raise ConfigError(f"{key}={path} is a prepared dataset's manifest: point {key} at its directory: "
                          f"{key}={where.parent}")
    if is_glob(path):
        files = tuple(Path(f) for f in sorted(globbing.glob(str(where))) if Path(f).is_file())
        if not files:
            raise ConfigError(f"{key}={path} matches no file: point {key} at {WHERE_HINT}")
        itemsize = _itemsize(dtype)
        return SourceSpec(key, name, path, files, tuple(f.stat().st_size // itemsize for f in files), dtype, weight)
    if where.is_dir():
        if not is_prepared_dir(where):
            raise ConfigError(f"{key}={path} is not a regular file nor a prepared dataset (no manifest.json): point "
                              f"{key} at {WHERE_HINT}")
        manifest = load_manifest(where)
        chosen = manifest.split(split)
        masks = manifest.mask_files(split)
        return SourceSpec(key, name, path, tuple(manifest.shard_files(split)), tuple(s.tokens for s in chosen.shards),
                          manifest.dtype, weight, manifest, None if masks is None else tuple(masks), chosen.documents,
                          layout)
    if not where.exists():
        if on_ranks and not where.is_absolute():  # a config.yaml written before paths were made absolute at launch
            raise ConfigError(f"{key}={path} is not a file in {Path.cwd()} (a relative path): run this from the "
                              "directory the run was launched in")
        if on_ranks:
            raise ConfigError(f"{key}={path} is not a file here (was it moved after submitting?): point {key} at "
                              "the token data")
        raise ConfigError(f"{key}={path} does not exist: point {key} at {WHERE_HINT}")
    return SourceSpec(key, name, path, (where,), (where.stat().st_size // _itemsize(dtype),), dtype, weight)


def _itemsize(dtype: str) -> int:
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def _weight(name: str, entry: Any) -> float:
    raw = entry.get("weight", 1.0)
    raw = 1.0 if raw is None else raw
    key = f"data.sources.{name}.weight"
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ConfigError(f"{key}={raw} is not a number: give {key} a weight >= 0 (the weights are normalised)")
    if raw < 0:
        raise ConfigError(f"{key}={raw} is negative: give every source a weight >= 0 (the weights are normalised)")
    return float(raw)


def _entry(name: str, entry: Any) -> Any:
    from contract.config.suggest import close_key

    if not hasattr(entry, "get") or not hasattr(entry, "keys"):
        raise ConfigError(f"data.sources.{name}={entry} is not a source: set data.sources.{name}.path=... and "
                          f"data.sources.{name}.weight=...")
    for k in map(str, entry.keys()):
        if k not in SOURCE_KEYS:
            close = close_key(k, list(SOURCE_KEYS))
            hint = f"did you mean data.sources.{name}.{close}? " if close else ""
            raise ConfigError(f"data.sources.{name}.{k} is not a key of a source: {hint}a source has only "
                              f"{' and '.join(SOURCE_KEYS)}")
    if not entry.get("path"):
        raise ConfigError(f"data.sources.{name} has no path: add data.sources.{name}.path=... ({WHERE_HINT})")
    return entry


def token_sources(data_cfg: Any, split: str = "train", on_ranks: bool = False) -> list[SourceSpec]:
    """The sources of a data=tokens config, each resolved (the mixture's sorted by name, weights normalised)."""
    sources = data_cfg.get("sources") or {}
    if not sources:
        if not data_cfg.get("path"):
            raise ConfigError("data=tokens needs a token file: add data.path=/path/to/tokens.bin (a token file, a "
                              "prepared directory or a shard glob), or data.sources.NAME.path=... for a mixture")
        return [resolve(str(data_cfg.path), "data.path", str(data_cfg.dtype), split=split, on_ranks=on_ranks,
                        layout=sft_layout(data_cfg))]
    if data_cfg.get("path"):
        raise ConfigError(f"data.path={data_cfg.path} and data.sources are both set: give one source with data.path "
                          "or a mixture with data.sources, not both (drop data.path)")
    entries = {str(name): _entry(str(name), sources[name]) for name in sorted(map(str, sources.keys()))}
    weights = {name: _weight(name, entry) for name, entry in entries.items()}
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(f"data.sources weights are all zero ({', '.join(entries)}): give at least one source a "
                          "positive weight")
    specs = [resolve(str(entry.get("path")), f"data.sources.{name}.path", str(data_cfg.dtype), name,
                     weights[name] / total, split, on_ranks) for name, entry in entries.items()]
    _same_tokenizer(specs)
    sft = next((s for s in specs if s.is_sft), None)
    if sft is not None:
        raise ConfigError(f"{sft.key}={sft.path} is supervised fine-tuning data (a loss mask beside its tokens), and "
                          "a mixture of it is not supported yet: train on it alone with data.path")
    return specs


def sft_layout(data_cfg: Any) -> str:
    """data.sft_layout (packed for a config written before the key existed), checked."""
    from contract.data.sft import check_layout

    layout = str(data_cfg.get("sft_layout") or "packed")
    check_layout(layout)
    return layout


def _same_tokenizer(specs: list[SourceSpec]) -> None:
    """Prepared sources must share a tokenizer: the same id must mean the same token in every source."""
    prepared = [s for s in specs if s.manifest is not None]
    for other in prepared[1:]:
        a, b = prepared[0].manifest.tokenizer, other.manifest.tokenizer
        if (a.fingerprint, a.vocab_size) != (b.fingerprint, b.vocab_size):
            raise ConfigError(f"data.sources.{prepared[0].name} and data.sources.{other.name} were prepared with "
                              f"different tokenizers ({a.name}, vocabulary {a.vocab_size}; {b.name}, vocabulary "
                              f"{b.vocab_size}): prepare every source of a mixture with the same tokenizer")
