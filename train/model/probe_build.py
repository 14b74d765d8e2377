"""Build a user's model for the launch probe (train/model/probe.py) without the memory training takes.

On the meta device first: no memory, no weights. A constructor that loads weights (Hugging Face's
`from_pretrained(local_dir)`, or `torch.load` of a file whose values it reads) fails there; it is built again on
the CPU, then moved to the meta device. Both builds run within a memory bound enforced on this process
(RLIMIT_DATA: an allocation past it fails instead of crowding the login node; on the meta device a constructor may
still read whole weight files into memory). Larger than the bound, the parameters are counted from the shapes in
the weight files `model.args` names (train/weights/files.py).
"""

from __future__ import annotations

import contextlib
import gc
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.errors import ConfigError
from train.model.build import build_model

GB = 1024**3
# The share of this host's available memory the CPU build may take (the ranks are not running here: the rest is
# left to the login node's other users).
CPU_BUILD_SHARE = 0.5


@dataclass
class Built:
    """The model (on the meta device), or facts read from its weight files, or why neither could be had."""

    model: nn.Module | None = None
    facts: dict[str, Any] | None = None
    note: str = ""  # how the model was counted, when the plan should say so
    error: str = ""


def first_line(err: BaseException) -> str:
    cause = err.__cause__ or err  # Hydra wraps the target's own exception
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


def _cgroup_headroom() -> float | None:
    """What this process's cgroup (v2) still allows, where it sets a limit."""
    try:
        line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::"))
        folder = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return float(int(limit) - int((folder / "memory.current").read_text()))
    except (OSError, StopIteration, ValueError):
        return None


def memory_bound() -> int:
    """Bytes the CPU build may take: a share of this host's available memory (its cgroup's, if lower)."""
    import psutil

    available = float(psutil.virtual_memory().available)
    headroom = _cgroup_headroom()
    return int(CPU_BUILD_SHARE * (available if headroom is None else min(available, headroom)))


def _data_bytes() -> int | None:
    """This process's data segment and private writable mappings now (what RLIMIT_DATA counts), on Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def memory_limit(extra: int) -> Iterator[bool]:
    """Allocations past `extra` more bytes fail while inside (yields False where no limit can be set)."""
    used = _data_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if used is None:
        yield False
        return
    limit = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield True
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


_OUT_OF_MEMORY = ("can't allocate memory", "cannot allocate memory", "not enough memory", "out of memory")


def _out_of_memory(err: BaseException | None) -> bool:
    """An allocation refused (by the limit): MemoryError, or a library's own words for it, however wrapped (Hydra
    wraps the target's exception)."""
    while err is not None:
        if isinstance(err, MemoryError) or any(words in str(err).lower() for words in _OUT_OF_MEMORY):
            return True
        err = err.__cause__ or err.__context__
    return False


def _build(model_cfg: Any, bound: int, on_meta: bool) -> nn.Module:
    """The model, moved to the meta device (only the shapes are needed), built with allocations past `bound` more
    bytes refused: on the CPU, and on the meta device too, where a constructor may still read its weight files."""
    with memory_limit(bound) as limited:
        if not limited and not on_meta:
            raise MemoryError("no memory limit can be set on this host")
        try:
            with torch.device("meta") if on_meta else contextlib.nullcontext():
                return build_model(model_cfg).to("meta")
        finally:
            gc.collect()


def _args(model_cfg: Any) -> Any:
    from omegaconf import OmegaConf

    args = model_cfg.get("args")
    return OmegaConf.to_container(args, resolve=True) if OmegaConf.is_config(args) else args


def _from_files(model_cfg: Any, why: str) -> Built:
    from train.weights.files import shape_facts, tensor_shapes, weight_files

    files = weight_files(_args(model_cfg))
    if not files:
        return Built(error=f"{why}; model.args names no weight files to read their shapes from")
    try:
        shapes = tensor_shapes(files)
    except Exception as err:  # not a weight file after all
        return Built(error=f"{why}; reading the shapes in {files[0]} failed ({first_line(err)})")
    names = ", ".join(p.name for p in files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
    return Built(facts=shape_facts(shapes), note=f"parameters counted from the shapes in {names}: {why}")


def build_for_probe(model_cfg: Any, bound: int | None = None) -> Built:
    """The model on the meta device, however it had to be built, or its weight files' facts; ConfigError for the
    user's input. `bound`: bytes the build may take (memory_bound() unless given)."""
    from train.weights.files import weight_files

    bound = memory_bound() if bound is None else bound
    limit = f"the {bound / GB:.1f} GB the probe may take here"
    try:
        return Built(_build(model_cfg, bound, on_meta=True))
    except ConfigError:
        raise
    except Exception as err:  # the user's code, which may need real tensors: try the CPU
        if _out_of_memory(err):
            return _from_files(model_cfg, f"building the model read more than {limit}")
        on_meta = f"the model could not be built on the meta device ({first_line(err)})"
    weights = sum(p.stat().st_size for p in weight_files(_args(model_cfg)))
    if weights > bound:  # it would not fit: don't start
        return _from_files(model_cfg, f"{on_meta}, and its weight files hold {weights / GB:.1f} GB, more than {limit}")
    try:
        return Built(_build(model_cfg, bound, on_meta=False))
    except ConfigError:
        raise
    except Exception as err:
        if not _out_of_memory(err):  # it fails on any device: the ranks will say how
            return Built(error=f"{on_meta}, nor on the CPU ({first_line(err)})")
    return _from_files(model_cfg, f"{on_meta}, nor on the CPU within {limit}")
