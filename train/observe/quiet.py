"""Third-party notices known to be harmless in the ways slurmtrain uses those libraries, silenced one by one so that
they do not read like faults next to correct results. Each filter matches one message (and, where it can, only our
own modules), says why it is harmless here, and lets everything else through.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from functools import partial
from typing import Any

# torch.distributed.checkpoint warns whenever it loads without a process group. launcher.export, launcher.sample
# and a local evaluation load a checkpoint in one process on purpose (load_dcp_model's no_dist=True, init_weights).
SINGLE_PROCESS_LOAD = r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load"

# FSDP2 warns when a wrapped module returns a view, in case the caller changes it in place (which would skip the
# all-gather hook). Our Transformer returns its logits as a view, and the loss only reads them (train/step.py:
# cross_entropy and z-loss on a reshaped copy in float32), so the warning's condition never happens. A user's own
# model (model._target_) or a Hugging Face one keeps the warning: only our classes are matched.
FSDP_VIEW = r"FSDP2-wrapped module \(FSDP(Transformer|Block)\) returned a view tensor"

# DTensor's advice when it redistributes over two mesh dimensions with two all-reduces instead of one: the gradient
# norm of a tp x dp layout (clip_grad_norm's _NormPartial over ["dp", "tp"]). Every rank runs both reductions in
# the same order and each all-reduce hands all of its group the same value, so the ranks agree; what remains is one
# extra collective on a scalar per step.
REDISTRIBUTE_ADVICE = "While redistributing from"

# deepspeed imports (transformers' save_pretrained imports it to ask whether the model is a DeepSpeed engine) log
# that no GPU was found; an export consolidates on the CPU by design.
DEEPSPEED_CPU = "Setting accelerator to CPU"


class _DropMessage(logging.Filter):
    """Drops the records whose message starts with `text` (or, `anywhere`, holds it)."""

    def __init__(self, text: str, anywhere: bool = False) -> None:
        super().__init__()
        self.text, self.anywhere = text, anywhere

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (self.text in msg if self.anywhere else msg.startswith(self.text))


def _drop(logger: str, text: str, anywhere: bool = False) -> None:
    target = logging.getLogger(logger)
    if not any(isinstance(f, _DropMessage) and f.text == text for f in target.filters):
        target.addFilter(_DropMessage(text, anywhere))


def single_process_load() -> None:
    warnings.filterwarnings("ignore", message=SINGLE_PROCESS_LOAD, category=UserWarning)


def fsdp_notices() -> None:
    """At an FSDP wrap: the view-tensor warning of our own modules, and DTensor's two-reductions advice."""
    warnings.filterwarnings("ignore", message=FSDP_VIEW, category=UserWarning)
    _drop("torch.distributed.tensor._redistribute", REDISTRIBUTE_ADVICE)


def deepspeed_cpu_notice() -> None:
    """Before anything imports deepspeed in a command that runs on the CPU (launcher.export): its logger, created
    at import, keeps the filter added to it here."""
    _drop("DeepSpeed", DEEPSPEED_CPU)


# DeepSpeed's torch backend, created by deepspeed.initialize, builds its shared-memory all-reduce for the CPU
# accelerator and prints that it did (deepspeed/comm/torch.py build_shm_op): a build note, on standard output, in
# the middle of a run's log. A build that fails raises instead.
SHM_BUILT = re.compile(r"DeepSpeed \S+ built successfully")


@contextmanager
def deepspeed_build_notice() -> Iterator[None]:
    """Around deepspeed.initialize: its standard output, less SHM_BUILT's line, passed on when it ends."""
    captured = io.StringIO()
    try:
        with redirect_stdout(captured):
            yield
    finally:
        kept = [line for line in captured.getvalue().splitlines(keepends=True) if not SHM_BUILT.fullmatch(line.strip())]
        sys.stdout.write("".join(kept))


@contextmanager
def deepspeed_consolidation() -> Iterator[Any]:
    """Around DeepSpeed's zero_to_fp32 (the module, yielded): its consolidation prints its progress on standard
    output (the checkpoint, its ZeRO stage and world size, the parameters reconstructed) and draws progress bars
    over the shards on stderr, and its import says it picked the CPU accelerator. Notices, not results, which
    would mix with a command's own output (an export prints its path there); a failure still raises."""
    deepspeed_cpu_notice()  # before the import: DeepSpeed's logger keeps the filter
    import deepspeed.utils.zero_to_fp32 as zero_to_fp32
    from tqdm import tqdm

    zero_to_fp32.tqdm = partial(tqdm, disable=True)
    with redirect_stdout(io.StringIO()):
        yield zero_to_fp32


def harness_notices() -> None:
    """lm_eval's own output that says nothing about the scores: `fatal: not a git repository` (simple_evaluate
    runs `git describe` in the working directory to record a revision in its results, which we do not keep: only
    results["results"] is read) and the progress bar of building each task's requests (TQDM_DISABLE comes too late
    once tqdm is imported; the ranks' log says what is evaluated)."""
    import lm_eval.api.task as task_module
    import lm_eval.evaluator as evaluator
    from tqdm import tqdm

    evaluator.get_git_commit_hash = _no_revision
    task_module.tqdm = partial(tqdm, disable=True)  # type: ignore[attr-defined]


def _no_revision(*_: Any) -> None:
    return None


# torchao (the fp8 extra) logs at import that its compiled extras for other Python builds or for sm_90a kernels
# ("Failed to load .../_C_mxfp8...so", "_C_cutlass_90a.abi3.so") and Triton are missing; transformers imports it
# whenever it is installed, so every Hugging Face path printed them. precision=fp8 uses torchao's float8 linear
# layers through torch._scaled_mm, none of those extras; on a machine without an sm_90 GPU fp8 is refused first.
TORCHAO_EXTRAS = ("Failed to load ", "Warning: Detected no triton")
# torchao registers its enums as pytree constants, which torch 2.13 deprecates with a warning per enum at import:
# a note to torchao's developers, not to a user.
PYTREE_ENUM = "is an Enum subclass and is now natively supported by torch.compile"


def import_notices() -> None:
    """At a process's start, before anything imports torchao: its loggers keep these filters (a filter acts on the
    logger that makes the record, so each one is named)."""
    for name in ("torchao", "torchao.kernel.intmm"):
        for start in TORCHAO_EXTRAS:
            _drop(name, start)
    _drop("torch.utils._pytree", PYTREE_ENUM, anywhere=True)
