"""A prepared dataset's shard files against its manifest: each listed, with the size it says (and, for supervised
fine-tuning data, its loss-mask shard beside it: one byte per token)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from contract.data.sft import mask_path
from contract.errors import ConfigError

if TYPE_CHECKING:
    from contract.data.manifest import Manifest

SPLITS = ("train", "val")


def check_shard_files(manifest: Manifest, path: Path) -> None:
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
