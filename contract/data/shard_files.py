"""A prepared dataset's shard files against its manifest: each listed, with the size it says (and, for supervised
fine-tuning data, its loss-mask shard beside it: one byte per token).

contract/data/manifest.py's load_manifest calls this; what the check reads of a manifest is ShardedManifest below,
so this module needs nothing of manifest.py (no import circle)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from contract.data.sft import mask_path
from contract.errors import ConfigError

SPLITS = ("train", "val")


class ListedShard(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def tokens(self) -> int: ...


class ListedSplit(Protocol):
    @property
    def shards(self) -> Sequence[ListedShard]: ...


class ShardedManifest(Protocol):
    """What the check reads of contract/data/manifest.py's Manifest."""

    @property
    def dtype(self) -> str: ...

    @property
    def sft(self) -> Mapping[str, Any] | None: ...

    @property
    def np_dtype(self) -> np.dtype: ...

    def split(self, name: str) -> ListedSplit: ...

    def shard_files(self, split: str) -> list[Path]: ...


def check_shard_files(manifest: ShardedManifest, path: Path) -> None:
    itemsize = manifest.np_dtype.itemsize
    for name in SPLITS:
        for shard, file in zip(manifest.split(name).shards, manifest.shard_files(name), strict=True):
            expected = [(file, shard.path, shard.tokens * itemsize, f"{shard.tokens} {manifest.dtype} tokens")]
            if manifest.sft is not None:
                expected.append((file.with_name(Path(mask_path(shard.path)).name), mask_path(shard.path),
                                 shard.tokens, f"a loss mask of {shard.tokens} tokens"))
            for where, listed, want, what in expected:
                try:
                    size = where.stat().st_size
                except OSError:
                    raise ConfigError(
                        f"{path} lists {listed}, which is missing: prepare the dataset again with "
                        f"its `python -m launcher.prepare` command (it rewrites only missing shards)"
                    ) from None
                if size != want:
                    raise ConfigError(
                        f"{where} holds {size} bytes, its manifest says {what} ({want} bytes): prepare the "
                        f"dataset again with its `python -m launcher.prepare` command and --overwrite"
                    ) from None
