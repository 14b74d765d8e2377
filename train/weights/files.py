"""The shapes of the weights a model loads, read from the files its `model.args` name, without loading them; and
the tensors of weight files read one at a time (tensor_reader: model.init_from's loading).

For the launch probe of a model too large to build on the login node: a safetensors file's header lists every
tensor's shape; a torch file (.bin, .pt, .pth) is unpickled onto the meta device (no data read). A directory
holds its *.safetensors files (a Hugging Face checkpoint, sharded or not), else its torch files.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterator
from math import prod
from pathlib import Path
from typing import Any

from contract.rules.init_source import SAFETENSORS, TORCH_FILES

# The first numbered component of a name: "model.layers.3.mlp.up.weight" -> ("model.layers", 3).
_NUMBERED = re.compile(r"^(.*?)\.(\d+)\.")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def weight_files(args: Any) -> list[Path]:
    """The weight files the model's arguments name: files with a weight suffix, and those in named directories."""
    found: list[Path] = []
    for text in _strings(args):
        path = Path(text).expanduser()
        try:
            if path.is_file() and path.suffix in (SAFETENSORS, *TORCH_FILES):
                found.append(path)
            elif path.is_dir():
                inside = sorted(path.glob(f"*{SAFETENSORS}")) or sorted(
                    p for p in path.iterdir() if p.suffix in TORCH_FILES)
                found.extend(inside)
        except OSError:  # a string that is not a path the OS accepts (too long, say)
            continue
    return list(dict.fromkeys(found))


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def _torch_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    import torch

    state = torch.load(path, map_location="meta", weights_only=True)
    return {name: tuple(t.shape) for name, t in _tensors(state)}


def _tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(tree, torch.Tensor):
        yield prefix.rstrip("."), tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, f"{prefix}{key}.")


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        shapes.update(_safetensors_shapes(path) if path.suffix == SAFETENSORS else _torch_shapes(path))
    return shapes


def _numbered(name: str) -> tuple[str, int] | None:
    match = _NUMBERED.match(name)
    return (match.group(1), int(match.group(2))) if match else None


def shape_facts(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """What the plan needs (train/model/probe.py's facts) from the tensors' names and shapes: the blocks are the largest
    numbered family of names ("model.layers.N."), as train/model/blocks.py takes the largest list of modules."""
    sizes = {name: prod(shape) for name, shape in shapes.items()}
    families: dict[str, dict[int, int]] = {}
    for name, size in sizes.items():
        numbered = _numbered(name)
        if numbered:
            per_index = families.setdefault(numbered[0], {})
            per_index[numbered[1]] = per_index.get(numbered[1], 0) + size
    lists = {prefix: blocks for prefix, blocks in families.items() if len(blocks) >= 2}
    prefix = max(lists, key=lambda p: sum(lists[p].values()), default=None)
    blocks = lists[prefix] if prefix is not None else {}
    root = [size for name, size in sizes.items() if (_numbered(name) or ("",))[0] != prefix]
    n_params = sum(sizes.values())
    return {
        "n_params": n_params,
        "block_class": [],
        "n_blocks": len(blocks),
        "block_params": blocks[min(blocks)] if blocks else 0,
        "root": sum(root),
        "largest_root": max(root, default=0),
        "largest_param": max(sizes.values(), default=0),
        "flops_per_token": 6.0 * n_params,
        "flops_source": "6 x parameters",
        "embedding_rows": None,
    }


def tensor_reader(files: tuple[Path, ...]) -> Callable[[str], Any]:
    """A saved tensor by its name, from whichever file holds it (each opened once: safetensors as a memory map,
    read one tensor at a time)."""
    holder: dict[str, Any] = {}
    for file in files:
        opened = _open(file)
        holder.update(dict.fromkeys(opened.keys(), opened))

    def read(key: str) -> Any:
        opened = holder[key]
        return opened[key] if isinstance(opened, dict) else opened.get_tensor(key)

    return read


def _open(file: Path) -> Any:
    if file.suffix == SAFETENSORS:
        from safetensors import safe_open

        return safe_open(str(file), framework="pt", device="cpu")  # a memory map: one tensor at a time
    import torch

    return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
