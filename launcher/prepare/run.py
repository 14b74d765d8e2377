"""A local preparation: the output directory, the worker pool, resume, and finalize (manifest.json written last).

Re-running the same command resumes: tasks whose completion record is there (and whose shards have the sizes it
lists) are skipped, the others are written again. A bad input found while reading stops every task, and what this
run wrote is removed (the directory too when this run created it): nothing is left half-done. Ctrl-C stops at the
next batch, keeps the finished tasks, and the same command resumes.
"""

from __future__ import annotations

import fcntl
import math
import multiprocessing as mp
import os
import queue
import shutil
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import ConfigError
from launcher.prepare.manifest import (
    MANIFEST,
    SPLITS,
    Manifest,
    Shard,
    Source,
    build_manifest,
    write_json_atomic,
    write_manifest,
)
from launcher.prepare.plan import PARTS, PLAN, Plan, difference, load_plan
from launcher.prepare.progress import Reporter
from launcher.prepare.shards import completed_record, record_path, run_task, shard_name


class Interrupted(Exception):
    """Ctrl-C: the finished tasks are kept and the same command resumes."""


class WorkerDied(Exception):
    """A worker process was killed (out of memory, a signal): the same command resumes."""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class Created:
    """What this run created, removed again when a bad input stops it."""

    root: Path | None = None  # the topmost directory this run created
    plan: bool = False
    tasks: list[int] = field(default_factory=list)


def _ours(out: Path) -> bool:
    return (out / PARTS).exists() or (out / MANIFEST).exists()


@contextmanager
def claimed(plan: Plan, overwrite: bool) -> Iterator[Created]:
    """Hold `plan.out` for this plan: create it, or resume it (the same plan), or with --overwrite replace another
    preparation; refuse a directory holding something else, or one that another preparation is writing (here or
    as SLURM jobs). The directory is locked for the block; a ConfigError raised in it undoes what this run wrote."""
    out = Path(plan.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a directory for the prepared dataset")
    created = Created()
    if not out.exists():
        top = out
        while not top.parent.exists():
            top = top.parent
        created.root = top
    out.mkdir(parents=True, exist_ok=True)
    try:
        with _locked(out):
            _claim(plan, overwrite, created)
            yield created
    except ConfigError:
        undo(plan, created)
        raise


def _claim(plan: Plan, overwrite: bool, created: Created) -> None:
    from launcher.prepare.slurm import refuse_live_jobs

    out = Path(plan.out)
    if any(out.iterdir()):
        if not _ours(out):
            raise ConfigError(
                f"--out {out} is not empty and holds no prepared dataset: give a new or empty directory"
            )
        refuse_live_jobs(plan)
        old = load_plan(out) if (out / PARTS / PLAN).exists() else None
        if old is None or old.fingerprint != plan.fingerprint:
            what = difference(old, plan) if old is not None else "a preparation whose plan is gone"
            if not overwrite:
                raise ConfigError(
                    f"--out {out} already holds a different preparation ({what}): give another "
                    f"--out, or add --overwrite to replace it"
                )
            _remove_preparation(out)
    (out / PARTS).mkdir(exist_ok=True)
    if not (out / PARTS / PLAN).exists():
        write_json_atomic(out / PARTS / PLAN, plan.to_json())
        created.plan = True


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """One preparation at a time per directory: an exclusive lock on the directory itself, released when the
    process ends however it ends."""
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another preparation is writing {out}: wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def _remove_preparation(out: Path) -> None:
    for split in SPLITS:
        shutil.rmtree(out / split, ignore_errors=True)
    shutil.rmtree(out / PARTS, ignore_errors=True)
    (out / MANIFEST).unlink(missing_ok=True)


def undo(plan: Plan, created: Created) -> None:
    """Remove what this run wrote (after a bad input): its tasks' shards and records, its plan, its directory."""
    out = Path(plan.out)
    if created.root is not None:
        shutil.rmtree(created.root, ignore_errors=True)
        return
    for index in created.tasks:
        for split in SPLITS:
            (out / shard_name(split, index)).unlink(missing_ok=True)
        record_path(plan, index).unlink(missing_ok=True)
    if created.plan:
        shutil.rmtree(out / PARTS, ignore_errors=True)
    for split in SPLITS:
        if (out / split).is_dir() and not any((out / split).iterdir()):
            (out / split).rmdir()


def pending_tasks(plan: Plan) -> list[int]:
    itemsize = np.dtype(plan.tokenizer.dtype).itemsize
    return [i for i in range(len(plan.tasks)) if completed_record(plan, i, itemsize) is None]


def prepare_local(plan: Plan, workers: int | None = None, overwrite: bool = False) -> tuple[Manifest, int]:
    """Prepare `plan` on this machine with up to `workers` processes (None: as many as pay off); returns the
    manifest written and the number of tasks this run wrote (the others were complete already)."""
    with claimed(plan, overwrite) as created:
        pending = pending_tasks(plan)
        if pending:
            (Path(plan.out) / MANIFEST).unlink(missing_ok=True)
            run_tasks(plan, pending, workers, created)
        return finalize(plan), len(pending)


# With --workers left to its default, a worker process is started for at least this much input: starting one
# (a spawned interpreter importing numpy and loading the tokenizer) costs a second or two of a core, about what a
# core tokenizes of a few megabytes; below that the tokenizer's threads in this one process do better.
AUTO_MB_PER_WORKER = 32.0


def worker_count(workers: int | None, pending_bytes: int, pending_tasks: int) -> int:
    """Processes for `pending_tasks` tasks: --workers when given, else one per CPU, at most one per task and (by
    default only) one per AUTO_MB_PER_WORKER of input."""
    if workers is None:
        workers = min(cpu_count(), max(1, math.ceil(pending_bytes / (AUTO_MB_PER_WORKER * 2**20))))
    return max(1, min(workers, pending_tasks))


def run_tasks(plan: Plan, pending: list[int], workers: int | None, created: Created) -> None:
    total = sum(plan.inputs[f].bytes for i in pending for f in plan.tasks[i])
    with Reporter(total, len(pending)) as reporter:
        processes = worker_count(workers, total, len(pending))
        if processes == 1:
            from launcher.prepare.tokenizer import encoder_for

            encoder = encoder_for(plan.tokenizer)  # loaded once, not per task
            for index in pending:
                try:
                    run_task(plan, index, encoder, progress=reporter.advance)
                except KeyboardInterrupt:
                    raise Interrupted() from None
                created.tasks.append(index)
                reporter.task_done()
        else:
            _run_pool(plan, pending, processes, created, reporter)


# ---------------------------------------------------------------- the worker processes

_worker: dict[str, Any] = {}


def _init_worker(plan: Plan, threads: int, progress: Any, stop: Any, parent: int) -> None:
    _end_with(parent)
    # The tokenizer's Rust thread pool starts at its first batch and reads its size then: the cores are shared
    # between the worker processes instead of each starting one thread per core.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the driver, which stops the workers
    from launcher.prepare.tokenizer import encoder_for

    _worker.update(plan=plan, encoder=encoder_for(plan.tokenizer), progress=progress, stop=stop)


def _end_with(parent: int) -> None:
    """This worker ends when the preparing process does, however it ends (kill -9, the OOM killer): an idle worker
    waits on the pool's queue, whose write end it holds itself, so it would live on as an orphan. Linux sends the
    parent-death signal; elsewhere a thread watches the parent's pid."""
    import ctypes
    import signal
    import threading
    import time

    pr_set_pdeathsig = 1
    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) == 0
    except AttributeError:  # not Linux: no prctl
        armed = False
    if os.getppid() != parent:  # the parent was gone before the signal was armed
        os._exit(1)
    if not armed:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def _work(index: int) -> int:
    def report(read_bytes: int, tokens: int) -> None:
        _worker["progress"].put((read_bytes, tokens))

    try:
        run_task(_worker["plan"], index, _worker["encoder"], report, _worker["stop"].is_set)
    except InterruptedError:
        return -1
    return index


class _Here:
    """The driver's own share of the work, on a thread: it starts at once, while the worker processes are still
    starting (a spawned interpreter takes a second or two to import numpy and the tokenizer)."""

    def __init__(self, plan: Plan, stop: Any) -> None:
        self.plan, self.stop = plan, stop
        self.progress: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self.encoder: Any = None

    def work(self, index: int) -> int:
        from launcher.prepare.tokenizer import encoder_for

        self.encoder = self.encoder or encoder_for(self.plan.tokenizer)
        try:
            run_task(self.plan, index, self.encoder, lambda b, t: self.progress.put((b, t)), self.stop.is_set)
        except InterruptedError:
            return -1
        return index


def _run_pool(plan: Plan, pending: list[int], processes: int, created: Created, reporter: Reporter) -> None:
    """`processes` workers: this process (a thread) and processes-1 spawned ones, each taking the next pending
    task when it finishes one."""
    from concurrent.futures import Executor, ThreadPoolExecutor

    ctx = mp.get_context("spawn")  # no fork of a process that may hold the tokenizer's threads or rich's
    progress, stop = ctx.Queue(), ctx.Event()
    threads = max(1, cpu_count() // processes)
    # This process's tokenizer threads too (read when they start, at its first batch; a user's setting wins).
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    here = _Here(plan, stop)
    todo = list(reversed(pending))
    futures: dict[Future[int], tuple[int, Executor, Any]] = {}
    error: BaseException | None = None

    def launch(executor: Executor, work: Any) -> None:
        if todo and error is None:
            index = todo.pop()
            futures[executor.submit(work, index)] = (index, executor, work)

    with (
        ThreadPoolExecutor(1) as thread,
        ProcessPoolExecutor(
            processes - 1,
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(plan, threads, progress, stop, os.getpid()),
        ) as pool,
    ):
        launch(thread, here.work)
        for _ in range(processes - 1):
            launch(pool, _work)
        try:
            while futures:
                done, _ = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain([progress, here.progress], reporter)
                for future in done:
                    index, executor, work = futures.pop(future)
                    exc = future.exception()
                    if exc is None and future.result() == index:
                        created.tasks.append(index)
                        reporter.task_done()
                        launch(executor, work)
                    elif exc is not None and error is None:
                        error = exc
                        stop.set()
        except KeyboardInterrupt:
            stop.set()
            error = Interrupted()
            wait(futures)
        _drain([progress, here.progress], reporter)
    if error is not None:
        from concurrent.futures.process import BrokenProcessPool

        if isinstance(error, BrokenProcessPool):
            raise WorkerDied(str(error)) from None
        raise error


def _drain(queues: list[Any], reporter: Reporter) -> None:
    for q in queues:
        while True:
            try:
                read_bytes, tokens = q.get_nowait()
            except queue.Empty:
                break
            reporter.advance(read_bytes, tokens)


# ---------------------------------------------------------------- finalize


def finalize(plan: Plan) -> Manifest:
    """Every task's record into manifest.json, written last and atomically."""
    itemsize = np.dtype(plan.tokenizer.dtype).itemsize
    shards: dict[str, list[Shard]] = {split: [] for split in SPLITS}
    sources: list[Source] = []
    skipped: list[tuple[str, int, str]] = []
    for index in range(len(plan.tasks)):
        record = completed_record(plan, index, itemsize)
        if record is None:
            raise RuntimeError(f"task {index} of {plan.out} is not complete")
        for split in SPLITS:
            if record["shards"][split] is not None:
                shards[split].append(Shard(**record["shards"][split]))
        sources.extend(Source(**s) for s in record["sources"])
        skipped.extend((s["path"], s["bytes"], s["reason"]) for s in record.get("skipped", []))
    manifest = build_manifest(
        plan.tokenizer.info,
        plan.tokenizer.eod_id,
        plan.options.val_fraction,
        plan.options.split_seed,
        shards,
        sources,
        plan.options.selection(),
        skipped,
    )
    write_manifest(plan.out, manifest)
    return manifest


def skipped_line(manifest: Manifest) -> str | None:
    """What was skipped, for the summary: `skipped 5 files (4.1 MB): 4 binary (e.g. ...), 1 not UTF-8 (...)`."""
    if not manifest.skipped:
        return None
    from launcher.prepare.inputs import REASONS

    files = sum(s.files for s in manifest.skipped.values())
    size = sum(s.bytes for s in manifest.skipped.values()) / 1e6
    reasons = ", ".join(
        f"{s.files:,} {REASONS.get(reason, reason)} (e.g. {s.paths[0]})" if s.paths else f"{s.files:,} {reason}"
        for reason, s in manifest.skipped.items()
    )
    return f"skipped {files:,} file{'s' if files != 1 else ''} ({size:,.1f} MB): {reasons}; listed in {MANIFEST}"
