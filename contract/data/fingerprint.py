"""The fingerprint of the data a run reads, saved with every checkpoint and compared on resume. Torch-free: the
launcher compares it before anything starts (launcher/checks/resume_checks.py), the ranks again when they resume.

A run's data position is a sample index; the same index on other data is other samples, so a resume on changed
data (another file, a file rewritten in place, other sources or weights, a checkpoint copied into a run that reads
something else) would go on silently on a different sample order. The fingerprint, by source (the config key
that names it: data.path or data.sources.NAME), with its weight:
  - a prepared directory: its manifest's fingerprint (the tokenizer, dtype, end-of-document id and every shard's
    checksum; contract/data/manifest.py);
  - token files (one, or a glob's): the dtype, the number of files, their sizes and a hash of BLOCKS blocks of
    BLOCK_BYTES spread evenly over the stream (a megabyte read whatever the size; a rewrite that keeps every size
    and every sampled block is not seen).
It is stored in the checkpoint's COMPLETE marker (contract/rundir/ckpt_layout.py write_marker) under "data"; a checkpoint
without it (written before, or of synthetic data or a user's dataset) is not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from contract.errors import ConfigError

BLOCKS = 16
BLOCK_BYTES = 64 * 1024
MARKER_KEY = "data"


def files_fingerprint(files: list[Path], dtype: str) -> str:
    sizes = [f.stat().st_size for f in files]
    digest = hashlib.sha256(json.dumps([dtype, len(files), sizes]).encode())
    total = sum(sizes)
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    span = max(total - BLOCK_BYTES, 0)
    for k in range(BLOCKS):
        offset = span * k // (BLOCKS - 1)
        for i, file in enumerate(files):  # the block's bytes, across file boundaries
            lo, hi = max(offset, starts[i]), min(offset + BLOCK_BYTES, starts[i + 1])
            if lo < hi:
                fd = os.open(file, os.O_RDONLY)
                try:
                    digest.update(os.pread(fd, hi - lo, lo - starts[i]))
                finally:
                    os.close(fd)
    return "sha256:" + digest.hexdigest()


def data_fingerprint(data_cfg: Any, on_ranks: bool = False) -> dict[str, dict[str, Any]] | None:
    """{"data.path" or "data.sources.NAME": {"fingerprint": ..., "weight": ...}}; None for data that is not read
    from token files (synthetic, a user's dataset)."""
    if data_cfg.get("_target_") or data_cfg.name != "tokens":
        return None
    from contract.data.spec import token_sources

    out = {}
    for spec in token_sources(data_cfg, on_ranks=on_ranks):
        fingerprint = spec.manifest.fingerprint if spec.manifest is not None else files_fingerprint(
            list(spec.files), spec.dtype)
        key = f"data.sources.{spec.name}" if spec.name else spec.key
        out[key] = {"fingerprint": fingerprint, "weight": round(spec.weight, 9)}
    return out


def saved_fingerprint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The data fingerprint a complete checkpoint was saved with (None: not recorded)."""
    from contract.rundir.ckpt_layout import MARKER

    try:
        marker = json.loads((Path(checkpoint_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker.get(MARKER_KEY) if isinstance(marker, dict) else None


def _short(fingerprint: str) -> str:
    return fingerprint.removeprefix("sha256:")[:12]


def describe_change(saved: dict[str, Any], current: dict[str, Any] | None) -> str | None:
    """What differs between a saved fingerprint and the current one, or None when nothing does."""
    current = current or {}
    changes = []
    for key in sorted(saved.keys() | current.keys()):
        old, new = saved.get(key), current.get(key)
        if old is None:
            changes.append(f"{key} added")
        elif new is None:
            changes.append(f"{key} gone")
        elif old["fingerprint"] != new["fingerprint"]:
            changes.append(f"{key}: {_short(old['fingerprint'])} -> {_short(new['fingerprint'])}")
        elif abs(old["weight"] - new["weight"]) > 1e-9:
            changes.append(f"{key} weight {old['weight']:.4g} -> {new['weight']:.4g}")
    return "; ".join(changes) or None


def refuse_changed_data(data_cfg: Any, checkpoint_dir: Path, step: int, on_ranks: bool = False) -> None:
    """ConfigError when the data of `data_cfg` is not what the checkpoint was trained on (unless
    data.allow_changed=true)."""
    if data_cfg.get("allow_changed"):
        return
    saved = saved_fingerprint(checkpoint_dir)
    if saved is None:
        return
    change = describe_change(saved, data_fingerprint(data_cfg, on_ranks))
    if change:
        run_dir = Path(checkpoint_dir).parent.parent
        raise ConfigError(f"{run_dir}'s checkpoint at step {step} was trained on other data ({change}): its data "
                          "position would go on over other samples; point the data back at what it trained on, add "
                          "data.allow_changed=true to resume on this data anyway, or pick another run.name")
