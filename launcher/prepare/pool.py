"""The local worker pool of a preparation: how many workers, each task run in a worker process that ends
with its parent (PR_SET_PDEATHSIG), progress and a worker's death reported, Ctrl-C stopping them all.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.prepare.plan import Plan
from launcher.prepare.progress import Reporter
from launcher.prepare.shards import run_task


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
