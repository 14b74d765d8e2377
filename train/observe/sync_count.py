"""Host reads of tensor values, counted per training step: the guard that a steady step never waits for the device.

A steady step (neither a log, validation, checkpoint nor stop step) must read nothing back: on a GPU each read
(`.item()`, `float(t)`, `bool(t)`, `.tolist()`, `.cpu()`, `nonzero`, a blocking copy to the host) stops the host
until the device has caught up, and the GPU then waits on Python for the next launches. A CPU cannot show that
cost, but it runs the same code: counting the reads there finds them.

    with SyncCounter() as reads:      # over train() (or any loop that calls step_begins / busy)
        train(cfg, env, device, run_dir)
    reads.steady_reads()              # the Reads of the steady steps: [] when all is well
    reads.per_steady_step()           # the mean number of reads per steady step (the benchmark prints it)
    reads.report()                    # one line per kind and place: how many per steady step, what, where

On a GPU, `SyncCounter(cuda="count")` adds CUDA's own account (torch.cuda.set_sync_debug_mode, armed in the
steady part of each step): `syncs_per_steady_step()` is the number a benchmark prints; `cuda="error"` raises at the
first synchronising call of a steady step (tests/gpu). The modes slow every operation a little, and torch.compile
may run eagerly under them: count in a run of its own, never in a timed one.

Two hooks see the reads: a TorchDispatchMode (`aten._local_scalar_dense`, which `.item()`, `float()`, `int()` and
`bool()` reach, `nonzero` and its kin, a copy to the host that is not non-blocking) and a TorchFunctionMode for
what never reaches the dispatcher on a CPU (`.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")` without
non_blocking). Both are thread-local and travel into autograd's threads: the data prefetch thread and an
asynchronous save's thread are not counted (they never hold up the training thread).

The loop tells the active counter where each step starts (`step_begins`) and which parts of it may read
(`busy("log")`, ...); with no counter active both cost one global lookup. `host_values` reads a tensor that lives
in host memory on every device (a gloo side group's, a pinned staging buffer): the counter leaves it out, and it
refuses a tensor on an accelerator, so that it can never hide a device sync.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Operators whose result the host must wait for (a value, or a shape that depends on values).
_READ_OPS = {"_local_scalar_dense", "nonzero", "nonzero_static", "is_nonzero", "equal", "masked_select",
             "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave"}
# This project's loop code (a `.to(cpu)` called from here is a copy the loop asked for).
_OURS = tuple(str(Path(__file__).resolve().parents[2] / part) + os.sep for part in ("train", "bench"))
# Tensor methods that read values without the dispatcher on a CPU (there: no operator at all).
_READ_METHODS = {"tolist", "numpy"}


@dataclass(frozen=True)
class Read:
    step: int
    kind: str  # the operator or method
    where: str  # the innermost frame of this project's code that caused it
    library: str = ""  # where a library other than torch made it (a DeepSpeed engine's own reads), else ""

    def __str__(self) -> str:
        inside = f" (in {self.library})" if self.library else ""
        return f"step {self.step}: {self.kind} at {self.where}{inside}"


_active: list[SyncCounter] = []


def step_begins(step: int) -> None:
    """The loop, at the start of step `step` (1-based): reads from here on belong to it."""
    if _active:
        _active[-1].begin(step)


def busy(reason: str) -> None:
    """The loop, in a step that may read (a log, validation, checkpoint, stop or recovery step), before it does:
    the step is not steady."""
    if _active:
        _active[-1].mark_busy(reason)


def host_values(t: torch.Tensor) -> list[Any]:
    """The values of a tensor in host memory on every device (never a device sync): not counted. A tensor on an
    accelerator is refused, so that this can never hide a read that waits for the device."""
    if t.device.type != "cpu":
        raise ValueError(f"host_values reads host tensors only; this one is on {t.device}")
    with paused():
        return t.tolist()  # type: ignore[no-any-return]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Reads inside are not counted (host_values; a counter's own bookkeeping)."""
    if not _active:
        yield
        return
    counter = _active[-1]
    counter.paused += 1
    try:
        yield
    finally:
        counter.paused -= 1


def _library() -> str:
    """Where outside this project and torch the read was made ("deepspeed/runtime/engine.py:2100", say), or ""."""
    for f in reversed(traceback.extract_stack()[:-3]):
        for packages in ("site-packages/", "dist-packages/"):
            if packages in f.filename and "/torch/" not in f.filename:
                return f"{f.filename.split(packages, 1)[1]}:{f.lineno}"
    return ""


def _caller() -> str:
    """The innermost frame of this project's train/ or bench/ that led to the read."""
    frames = traceback.extract_stack()[:-3]
    ours = [f for f in frames if f.filename.startswith(_OURS) and f.filename != __file__]
    if not ours:
        return "(outside this project)"
    f = ours[-1]
    return f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"


def _to_host(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A blocking copy to the host: `.cpu()` anywhere, or `.to(<the cpu>)` without non_blocking=True in this
    project's code (on a CPU tensor neither is an operator at all, so the method is what shows them). A library's
    `.to(device)` onto the device a tensor is already on (clip_grad_norm_'s) reads as the same call on a CPU and is
    no copy on a GPU: only our own are counted; on a GPU the dispatch hook sees any real copy to the host."""
    if kwargs.get("non_blocking") or (len(args) > 2 and isinstance(args[2], bool) and args[2]):
        return False
    name = getattr(func, "__name__", "")
    if name == "cpu":
        return True
    if name != "to" or not sys._getframe(2).f_code.co_filename.startswith(_OURS):
        return False
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


class _Methods(TorchFunctionMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _READ_METHODS or _to_host(func, args, kwargs):
            self.counter.record(name)
        return func(*args, **kwargs)


class _Operators(TorchDispatchMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _READ_OPS:
            self.counter.record(name)
        elif name in ("_to_copy", "copy_") and _device_to_host(name, args, kwargs):
            self.counter.record(f"{name} to host")
        return func(*args, **kwargs)


def _device_to_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A blocking copy from an accelerator to the host (only a GPU has them: a CPU's are caught as methods)."""
    if kwargs.get("non_blocking") or (name == "copy_" and len(args) > 2 and args[2]):
        return False
    src = args[1] if name == "copy_" else args[0]
    if not isinstance(src, torch.Tensor) or src.device.type == "cpu":
        return False
    dst = args[0].device if name == "copy_" else kwargs.get("device")
    return dst is not None and torch.device(dst).type == "cpu"


# torch's words for a synchronising CUDA call under torch.cuda.set_sync_debug_mode("warn").
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


class SyncCounter:
    """Counts host reads per step of the training loop it is active over (see the module docstring).

    `cuda`: also CUDA's own account, from `torch.cuda.set_sync_debug_mode`, switched on at each step from
    `armed_from` (the first steps compile and warm up) and off at the step's first busy mark: "count" records each
    synchronising call as a Read of kind "cuda sync" (the benchmark's figure: `syncs_per_steady_step`), "error"
    makes it raise where it happens (the gpu tier's guard)."""

    def __init__(self, cuda: str | None = None, armed_from: int = 2) -> None:
        if cuda not in (None, "count", "error"):
            raise ValueError(f"cuda={cuda!r}: None, 'count' or 'error'")
        self.cuda, self.armed_from = cuda, armed_from
        self.step = 0  # before the first step: set-up
        self.reads: list[Read] = []
        self.busy: dict[int, set[str]] = defaultdict(set)
        self.steps: set[int] = set()
        self.paused = 0
        self._modes: list[Any] = []
        self._warnings: Any = None
        self._showwarning: Any = None

    def begin(self, step: int) -> None:
        self.step = step
        self.steps.add(step)
        if self.cuda is not None and step >= self.armed_from:
            torch.cuda.set_sync_debug_mode("warn" if self.cuda == "count" else "error")

    def mark_busy(self, reason: str) -> None:
        self.busy[self.step].add(reason)
        if self.cuda is not None:
            torch.cuda.set_sync_debug_mode("default")

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if CUDA_SYNC_WARNING in str(message):
            self.record("cuda sync")
        else:
            self._showwarning(message, category, filename, lineno, *rest)

    def record(self, kind: str) -> None:
        if self.paused:
            return
        self.paused += 1  # the stack walk below makes no reads, but stay out of our own way
        try:
            self.reads.append(Read(self.step, kind, _caller(), _library()))
        finally:
            self.paused -= 1

    def __enter__(self) -> SyncCounter:
        _active.append(self)
        if self.cuda == "count":
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.filterwarnings("always", message=f".*{CUDA_SYNC_WARNING}")
            self._showwarning, warnings.showwarning = warnings.showwarning, self._on_warning  # type: ignore[assignment]
        self._modes = [_Methods(self), _Operators(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        if self.cuda is not None:
            torch.cuda.set_sync_debug_mode("default")
        if self._warnings is not None:
            self._warnings.__exit__(*exc)  # restores warnings.showwarning too
            self._warnings = None
        _active.remove(self)

    def steady_steps(self) -> list[int]:
        """The steps begun under this counter that nothing marked busy."""
        return sorted(s for s in self.steps if not self.busy.get(s))

    def steady_reads(self) -> list[Read]:
        """The reads made in steady steps (none, when the loop is as it should be)."""
        steady = set(self.steady_steps())
        return [r for r in self.reads if r.step in steady]

    def per_steady_step(self) -> float:
        """The mean number of reads per steady step (0.0 with no steady step)."""
        steady = self.steady_steps()
        return len(self.steady_reads()) / len(steady) if steady else 0.0

    def syncs_per_steady_step(self) -> float:
        """With cuda="count": the mean number of synchronising CUDA calls per steady step, as CUDA counts them
        (a read of a host tensor is a Read but no sync)."""
        steady = self.steady_steps()
        syncs = [r for r in self.steady_reads() if r.kind == "cuda sync"]
        return len(syncs) / len(steady) if steady else 0.0

    def report(self) -> str:
        """The reads of the steady steps, one line per kind and place: how many per steady step, what, where
        (empty: none)."""
        steady = max(len(self.steady_steps()), 1)
        counts = Counter((r.kind, r.where, r.library) for r in self.steady_reads())
        return "\n".join(f"{n / steady:g} per step: {kind} at {where}" + (f" (in {lib})" if lib else "")
                         for (kind, where, lib), n in counts.most_common())
