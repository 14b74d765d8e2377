"""Consolidate a checkpoint (any world size, any strategy) into one set of full weights, on CPU, without a process
group, and write them as a safetensors file. Run by launcher/export.py; the Hugging Face directory is
train/weights/hf_export.py's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from train.observe import quiet

quiet.single_process_load()  # every load here runs in one process on purpose
MODEL_PREFIX = "app.model."
# Wrappers whose names may appear in saved keys: activation checkpointing's and torch.compile's.
WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_key(key: str) -> str:
    """A saved name without the wrappers' parts: the model's own name."""
    for part in WRAPPER_PARTS:
        key = key.replace(part, "")
    return key


def load_dcp_model(path: Path) -> dict[str, torch.Tensor]:
    """The model's full tensors from a DCP checkpoint, whatever the world size that wrote it (no optimizer)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = FileSystemReader(str(path))
    keys = [k for k in reader.read_metadata().state_dict_metadata if k.startswith(MODEL_PREFIX)]
    loaded: dict[str, Any] = {}
    _load_state_dict(loaded, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys=set(keys)), no_dist=True)
    model = loaded["app"]["model"]
    return {clean_key(k): v for k, v in _flatten(model).items() if isinstance(v, torch.Tensor)}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_deepspeed_model(step_dir: Path) -> dict[str, torch.Tensor]:
    """A DeepSpeed checkpoint's whole model (export, sample, init_from), without DeepSpeed's notices."""
    with quiet.deepspeed_consolidation() as zero_to_fp32:
        state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(step_dir), tag="model_optim")
    return {clean_key(k): v for k, v in state.items()}


def load_model_state(step_dir: Path) -> dict[str, torch.Tensor]:
    path = step_dir / "model_optim"
    if (path / ".metadata").is_file():
        return load_dcp_model(path)
    return load_deepspeed_model(step_dir)


def tied_groups(model_cfg: Any) -> list[list[str]]:
    """The state-dict names that are one tensor in the model (tied weights: an output layer sharing the input
    embedding), each group sorted. The checkpoint can't tell: it loads them as separate, equal tensors. The model
    built on the meta device (no memory, no weights) can."""
    from train.model.build import build_model

    with torch.device("meta"):
        model = build_model(model_cfg)
    return tie_groups(model)


def tie_groups(model: torch.nn.Module) -> list[list[str]]:
    """The state-dict names of `model` that are one tensor (on any device, the meta device included)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        # One tensor: the same storage seen the same way (a view of part of it is another tensor).
        view = (tensor.untyped_storage()._cdata, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        groups.setdefault(view, []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def store_once(state: dict[str, torch.Tensor], groups: list[list[str]]) -> tuple[dict[str, torch.Tensor],
                                                                                   dict[str, str]]:
    """The state with each tied group under its first name only, as `safetensors.torch.save_model` keeps it (so
    `load_model` takes the file), and {dropped name: kept name}, which save_model writes into the metadata."""
    kept = dict(state)
    aliases: dict[str, str] = {}
    for group in groups:
        present = [name for name in group if name in state]
        for name in present[1:]:
            if not torch.equal(state[name], state[present[0]]):
                raise ValueError(f"{name} and {present[0]} are tied in the model but differ in the checkpoint")
            del kept[name]
            aliases[name] = present[0]
    return kept, aliases


def save_safetensors(state: dict[str, torch.Tensor], out: Path, metadata: dict[str, str],
                     tied: list[list[str]]) -> None:
    from safetensors.torch import save_file

    state, aliases = store_once(state, tied)
    # clone: safetensors refuses tensors that share storage (a DeepSpeed state's, say).
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={**aliases, **metadata})


def follow_umask(path: Path) -> None:
    """Give what an export wrote the mode that open() and mkdir() give under the user's umask, as every other file
    of a run has: safetensors writes its files 0600 (through a temporary file), whatever the umask."""
    mask = os.umask(0)
    os.umask(mask)
    for written in [path, *path.rglob("*")] if path.is_dir() else [path]:
        written.chmod((0o777 if written.is_dir() else 0o666) & ~mask)
