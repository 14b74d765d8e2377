"""Failures from outside the code, told in one line: what happened, where, and what to do.

A rank that dies of its environment (a full disk or quota, a run directory that vanished or turned read-only or
unwritable, host memory exhausted) is not a bug to debug: the user needs one line, not a chain of tracebacks.
`classify` reads an exception (its causes and contexts, and the per-rank failures a torch.distributed.checkpoint
save gathers) by type and errno; `run_dir_problem` looks at the run directory itself (for the launcher, which only
sees an exit code); `oom_killed` reads the kernel's log for a rank that died of SIGKILL. Every ending path uses
these: the rank (train/entry.py), the local launcher (launcher/run/local.py) and launcher.status (through the event).

Pure stdlib: the launcher imports it on a login node.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contract.rundir import ckpt_layout as layout

# The exit code of a rank (and of the local launcher) that ended for one of these causes (sysexits' EX_IOERR).
EXIT_ENVIRONMENT = 74
# Set by the local launcher: a directory where a rank that dies of its environment leaves its one line (as
# rank_N.json) for the launcher to print, so that the terminal gets it once, whichever ranks saw the cause.
ENDING_DIR_ENV = "SLURMTRAIN_ENDING_DIR"
# The event kind in RUN_DIR/events.jsonl (contract/rundir/events.py); not an unexpected failure: never requeued.
EVENT_KIND = "environment"

DISK_FULL = "disk_full"
QUOTA = "disk_quota"
READ_ONLY = "read_only"
RUN_DIR_GONE = "run_dir_gone"
NOT_WRITABLE = "not_writable"
HOST_MEMORY = "host_memory"
OOM_KILLED = "oom_killed"
# Replica groups on SLURM whose lighthouse is gone for good (its job ended): they can't meet without it.
LIGHTHOUSE_GONE = "lighthouse_gone"

MEMORY_FIX = ("reduce trainer.micro_batch_size (raise trainer.grad_accum_steps to keep the batch) or "
              "trainer.prefetch_steps, or ask for more memory (cluster.mem_per_task_gb)")


@dataclass(frozen=True)
class Ending:
    cause: str
    line: str  # the one line the user sees, "error: ..."


class EndedByEnvironment(RuntimeError):
    """Raised where the code itself finds what it needs gone from outside (a replica group's lighthouse): `ending`
    is what the user is told, and the run ends as for any cause here, never requeued."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.line)
        self.ending = ending


def _causes(err: BaseException, seen: set[int] | None = None) -> Iterator[tuple[BaseException, int | None]]:
    """The error and everything behind it, with the rank a checkpoint collective says it failed on (or None)."""
    seen = set() if seen is None else seen
    stack: list[tuple[BaseException, int | None]] = [(err, None)]
    while stack:
        current, rank = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current, rank
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            for failed_rank, wrapped in sorted(failures.items(), reverse=True):
                inner = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
                if isinstance(inner, BaseException):
                    stack.append((inner, int(failed_rank)))
        for inner in getattr(current, "exceptions", ()) or ():  # an ExceptionGroup
            if isinstance(inner, BaseException):
                stack.append((inner, rank))
        for inner in (current.__context__, current.__cause__):
            if inner is not None:
                stack.append((inner, rank))


def _is_host_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError):
        return True
    # torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't allocate memory ... Error code 12").
    text = str(err)
    return isinstance(err, RuntimeError) and "can't allocate memory" in text and "CPUAllocator" in text


def _is_checkpoint_collective(err: BaseException) -> bool:
    return type(err).__name__ == "CheckpointException"


def what_was_written(path: str | None, run_dir: Path, in_checkpoint: bool) -> str:
    """What a failed write was writing, in the user's words: 'checkpoint step 8 (PATH)', 'metrics (PATH)', ..."""
    name = Path(path).name if path else ""
    step = re.search(r"step_(\d+)", path or "")
    if (in_checkpoint or step) and "checkpoints" in (path or "checkpoints"):
        where = f" ({path})" if path else f" ({layout.checkpoints_root(run_dir)})"
        return f"checkpoint step {step.group(1)}{where}" if step else f"a checkpoint{where}"
    for file_name, label in (("metrics.jsonl", "metrics"), ("events.jsonl", "events"), (".log", "logs")):
        if name.endswith(file_name):
            return f"{label} ({path})"
    return path or str(run_dir)


def resume_hint(run_dir: Path) -> str:
    """The way back, once the cause is gone."""
    try:
        latest = layout.latest_complete_checkpoint(run_dir)
        readable = Path(run_dir).is_dir()
    except OSError:
        latest, readable = None, False
    if latest is None and readable:  # nothing complete yet: the same command starts the run over
        return "then run the same command: no checkpoint was complete yet, so it starts from step 0"
    if latest is None:
        return "then run the same command to resume from the newest complete checkpoint"
    return f"then run the same command: it resumes from the last complete checkpoint (step {latest.step})"


def _where(rank: int | None, host: str | None) -> str:
    if rank is None:
        return f"on {host}" if host else ""
    return f"on rank {rank}" + (f" ({host})" if host else "")


def run_dir_gone_line(run_dir: Path, what: str, where: str) -> str:
    return (f"error: the run directory {run_dir} disappeared while writing {what} {where}: restore it (or remount "
            "its filesystem), then run the same command to resume from its newest complete checkpoint")


def _disk_line(cause: str, run_dir: Path, what: str, where: str) -> str:
    hint = resume_hint(run_dir)
    if cause == DISK_FULL:
        return (f"error: disk full (no space left on device) writing {what} {where}: free space on that filesystem "
                f"(df -h {run_dir}) or move run.root to a larger one, {hint}")
    if cause == QUOTA:
        return (f"error: disk quota exceeded writing {what} {where}: free space within your quota or have it raised "
                f"(quota -s), {hint}")
    if cause == READ_ONLY:
        return (f"error: the run directory {run_dir} turned read-only (read-only file system) writing {what} "
                f"{where}: remount it writable (or move the run to a writable filesystem), {hint}")
    return (f"error: permission denied writing {what} {where}: make {run_dir} writable for you again "
            f"(chmod -R u+w, or its owner), {hint}")


def memory_line(where: str, step: int | None, run_dir: Path) -> str:
    at = f" at step {step}" if step is not None else ""
    return f"error: host memory exhausted {where}{at}: {MEMORY_FIX}; {resume_hint(run_dir)}"


def oom_killed_line(rank: int, host: str, step: int | None, run_dir: Path) -> str:
    at = f" at step {step}" if step is not None else ""
    return (f"error: rank {rank} ({host}) was killed by the kernel's OOM killer{at}: host memory exhausted: "
            f"{MEMORY_FIX}; {resume_hint(run_dir)}")


def slurm_oom_line(job: str, run_dir: Path) -> str:
    """A job SLURM ended as OUT_OF_MEMORY: its cgroup's limit killed a rank (launcher.status reads it from sacct)."""
    return (f"error: job {job} ran out of host memory (SLURM: OUT_OF_MEMORY, a rank killed at the job's memory "
            f"limit): {MEMORY_FIX}; {resume_hint(run_dir)}")


_ERRNO_CAUSE = {errno.ENOSPC: DISK_FULL, errno.EDQUOT: QUOTA, errno.EROFS: READ_ONLY, errno.EACCES: NOT_WRITABLE,
                errno.EPERM: NOT_WRITABLE}


def classify(err: BaseException, run_dir: Path, *, rank: int | None = None, host: str | None = None,
             step: int | None = None) -> Ending | None:
    """The environmental cause of `err`, as one line, or None when it is something else (a bug, a peer's loss)."""
    run_dir = Path(run_dir)
    chain = list(_causes(err))
    in_checkpoint = any(_is_checkpoint_collective(e) for e, _ in chain)
    for current, failed_rank in chain:
        if isinstance(current, EndedByEnvironment):
            return current.ending
        where = _where(failed_rank if failed_rank is not None else rank, host if failed_rank in (None, rank) else None)
        if _is_host_memory(current):
            return Ending(HOST_MEMORY, memory_line(where, step, run_dir))
        if not isinstance(current, OSError) or current.errno is None:
            continue
        path = current.filename if isinstance(current.filename, str) else None
        what = what_was_written(path, run_dir, in_checkpoint)
        if current.errno == errno.ENOENT:
            # A missing file is only the environment's doing when the run directory itself went away.
            if not run_dir.is_dir():
                return Ending(RUN_DIR_GONE, run_dir_gone_line(run_dir, what, where))
            continue
        cause = _ERRNO_CAUSE.get(current.errno)
        if cause is not None:
            return Ending(cause, _disk_line(cause, run_dir, what, where))
    return None


def run_dir_problem(run_dir: Path, where: str = "") -> Ending | None:
    """What is wrong with the run directory itself, found by trying: gone, read-only, unwritable or full. For the
    launcher, which sees a rank's exit code but not its exception. None: it takes a write."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return Ending(RUN_DIR_GONE, run_dir_gone_line(run_dir, "its files", where))
    try:
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-check-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        cause = _ERRNO_CAUSE.get(err.errno or 0)
        if cause is not None:
            return Ending(cause, _disk_line(cause, run_dir, str(run_dir), where))
    return None


def oom_killed(pid: int) -> bool:
    """Whether the kernel's log says its OOM killer killed process `pid` (global or a cgroup's limit, as under
    SLURM's cgroups). False when the log can't be read (dmesg restricted to root on many hosts)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(rf"Killed process {pid}\b", out) is not None
