"""Checkpoint integrity: a manifest of every file's size and CRC-32, checked before a checkpoint is resumed.

    step_<N>/manifest/rank<R>.json    {"files": {"model_optim/__1_0.distcp": {"size": ..., "crc32": ...}, ...}}

Each rank lists the files it wrote (by the rank number in their names; rank 0 also owns the rest), so the hashing
runs on every rank at once and no rank reads another's shards. Rank 0 writes the COMPLETE marker only once every
rank's piece is there. Resume checks the sizes always and the checksums with `checkpoint.verify=full`; a
checkpoint that fails is moved aside to `checkpoints/quarantine/` (never deleted) and the previous complete one is
used. Pure stdlib.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from pathlib import Path

MANIFEST_DIR = "manifest"
QUARANTINE_DIR = "quarantine"
# The rank a file belongs to, from its name: DCP's __R_K.distcp, our rng_rankR.pt, DeepSpeed's *_rank_R_*.
_RANK_IN_NAME = re.compile(r"(?:^__|rank_?)(\d+)(?=[_.])")
_CHUNK = 8 << 20


def owner(name: str) -> int:
    match = _RANK_IN_NAME.search(name)
    return int(match.group(1)) if match else 0


def crc32(path: Path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def _files(step_path: Path) -> list[Path]:
    skip = {MANIFEST_DIR}
    return sorted(p for p in step_path.rglob("*")
                  if p.is_file() and p.relative_to(step_path).parts[0] not in skip and not p.name.startswith("."))


def _own(step_path: Path, rank: int) -> list[Path]:
    # .metadata (DCP's index) is a dot-file: rank 0 owns it explicitly.
    files = [p for p in _files(step_path) if owner(p.name) == rank]
    meta = step_path / "model_optim" / ".metadata"
    if rank == 0 and meta.is_file():
        files.append(meta)
    return files


def write_piece(step_path: Path, rank: int) -> None:
    """This rank's part of the manifest: the files it wrote, once they are all on disk."""
    entries = {str(p.relative_to(step_path)): {"size": p.stat().st_size, "crc32": crc32(p)}
               for p in _own(step_path, rank)}
    folder = step_path / MANIFEST_DIR
    folder.mkdir(exist_ok=True)
    tmp = folder / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps({"files": entries}))
    tmp.rename(folder / f"rank{rank}.json")  # never seen half-written


def missing_pieces(step_path: Path, world_size: int) -> list[int]:
    """Ranks whose piece is not written yet."""
    return [r for r in range(world_size) if not (step_path / MANIFEST_DIR / f"rank{r}.json").is_file()]


def wait_for_pieces(step_path: Path, world_size: int, timeout_s: float) -> list[int]:
    """Ranks whose piece is still missing after the timeout (empty: all there)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = missing_pieces(step_path, world_size)
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.05)


def verify(step_path: Path, full: bool) -> str | None:
    """Why this complete checkpoint can't be trusted, or None. A checkpoint written before manifests existed has
    none and passes."""
    folder = step_path / MANIFEST_DIR
    if not folder.is_dir():
        return None
    for piece in sorted(folder.glob("rank*.json")):
        try:
            files = json.loads(piece.read_text())["files"]
        except (OSError, ValueError, KeyError):
            return f"its manifest {piece.name} is unreadable"
        for rel, expected in files.items():
            path = step_path / rel
            if not path.is_file():
                return f"{rel} is missing"
            size = path.stat().st_size
            if size != expected["size"]:
                return f"{rel} has {size} bytes, {expected['size']} were written"
            if full and crc32(path) != expected["crc32"]:
                return f"{rel} does not match its checksum (changed after it was written)"
    return None


def quarantine(step_path: Path) -> Path:
    """Move a checkpoint that failed verification out of the way (kept for inspection), marker first."""
    dest_root = step_path.parent / QUARANTINE_DIR
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / f"{step_path.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest = dest_root / f"{step_path.name}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
        n += 1
    step_path.rename(dest)
    return dest
