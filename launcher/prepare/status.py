"""`python -m launcher.status DIR` on a prepared dataset directory (one row, complete or in progress, local or SLURM),
or on a folder of them (one row per dataset, as for a folder of runs).

The row is read from the directory alone (manifest.json, .parts/plan.json, the tasks' completion records,
.parts/jobs.txt) plus what SLURM says of the jobs there, through the same helpers as a run's row:

  complete              manifest.json is there and every shard it lists has its size
  preparing             its SLURM array or finalize job is queued or running, or a local preparation holds the lock
  failed                its SLURM jobs ended and a task or the finalize job did not complete
  incomplete-resumable  stopped before the end (Ctrl-C, a kill, a cancelled job): the same command resumes
"""

from __future__ import annotations

import fcntl
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.data.manifest import MANIFEST, SPLITS, Manifest, load_manifest
from contract.errors import ConfigError
from launcher.prepare.jobs import JOBS
from launcher.prepare.plan import PARTS, PLAN, Plan, load_plan
from launcher.prepare.shards import completed_record

COMPLETE, PREPARING, FAILED, RESUMABLE = "complete", "preparing", "failed", "incomplete-resumable"
RESUME = "run the same `python -m launcher.prepare ... --out {out}` command again"


@dataclass
class PrepRow:
    name: str
    dir: str
    kind: str  # "prepared dataset", to tell it from a run's row in --json
    job: str  # "array,finalize" SLURM ids, or "local"
    state: str  # COMPLETE, PREPARING, FAILED or RESUMABLE
    slurm_state: str | None  # the newest job's state (squeue, then sacct), None for a local preparation
    tasks_complete: int | None
    tasks_total: int | None  # None for a dataset whose plan is gone (only its manifest)
    train_tokens: int
    train_documents: int
    val_tokens: int
    val_documents: int
    tokenizer: str
    next: str  # what to run next


def is_preparation(path: Path) -> bool:
    """A directory `launcher.prepare` wrote: a finished dataset, or one being (or stopped being) prepared."""
    return (path / MANIFEST).is_file() or (path / PARTS / PLAN).is_file()


def preparations(path: Path) -> list[Path]:
    """The prepared datasets DIR stands for: itself, or the datasets directly inside a folder that holds no runs
    (a run root's rows are its runs); [] for neither."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return []
    if is_preparation(path):
        return [path]
    children = sorted(c for c in path.iterdir() if c.is_dir())
    if any((c / "config.yaml").is_file() for c in children):
        return []
    return [c for c in children if is_preparation(c)]


def _locked_here(path: Path) -> bool:
    """A local preparation holds the directory's lock (launcher.prepare.run._locked) while it writes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the shared lock at once
    return False


def _slurm(path: Path) -> tuple[str, str | None, bool]:
    """(job cell, SLURM state, still queued) of the newest submission in .parts/jobs.txt; ("local", None, False)
    without one."""
    from contract.rundir import accounting
    from launcher.observe.run_rows import slurm_state

    jobs = (path / PARTS / JOBS).read_text().split() if (path / PARTS / JOBS).is_file() else []
    if not jobs:
        return "local", None, False
    array, final = (jobs[-2], jobs[-1]) if len(jobs) >= 2 else (jobs[-1], jobs[-1])
    queued = accounting.queue_state(array) or accounting.queue_state(final)
    if queued:
        return f"{array},{final}", queued, True
    sacct = accounting.attempts([final])
    return f"{array},{final}", slurm_state(final, None if sacct is None else sacct.get(final, [])), False


def _counts(manifest: Manifest | None, records: list[dict[str, Any]]) -> dict[str, int]:
    counts = {}
    for split in SPLITS:
        if manifest is not None:
            counts[f"{split}_tokens"] = manifest.split(split).tokens
            counts[f"{split}_documents"] = manifest.split(split).documents
        else:
            shards = [r["shards"][split] for r in records if r["shards"].get(split)]
            counts[f"{split}_tokens"] = sum(s["tokens"] for s in shards)
            counts[f"{split}_documents"] = sum(s["documents"] for s in shards)
    return counts


def _complete_manifest(path: Path) -> Manifest | None:
    if not (path / MANIFEST).is_file():
        return None
    try:
        return load_manifest(path)
    except ConfigError:
        if (path / PARTS / PLAN).is_file():
            return None  # a shard gone or cut short: the plan's command rewrites what is missing
        raise


def preparation_row(path: Path) -> PrepRow:
    """The row of a preparation directory; ConfigError (one line, the fix) when its plan or manifest is damaged."""
    path = Path(path)
    manifest = _complete_manifest(path)
    plan: Plan | None = load_plan(path)
    records: list[dict[str, Any]] = []
    if plan is not None:
        itemsize = np.dtype(plan.tokenizer.dtype).itemsize
        records = [r for i in range(len(plan.tasks)) if (r := completed_record(plan, i, itemsize)) is not None]
    total = len(plan.tasks) if plan is not None else None
    job, slurm_state, queued = _slurm(path)
    out = shlex.quote(str(path.resolve()))
    if manifest is not None:
        state, done = COMPLETE, total
        vocab = manifest.tokenizer.vocab_size
        nxt = f"train on it: python -m launcher data=tokens data.path={out} (model.vocab_size >= {vocab})"
    elif queued:
        state, done = PREPARING, len(records)
        array, _, final = job.partition(",")
        nxt = f"wait: squeue -j {job}; logs in {shlex.quote(str(path / PARTS / 'slurm'))}; cancel: scancel {array} {final}"
    elif job == "local" and _locked_here(path):
        state, done = PREPARING, len(records)
        nxt = "wait for the preparation running here (Ctrl-C stops it; its command resumes)"
    else:
        done = len(records)
        failed = slurm_state is not None and slurm_state not in ("COMPLETED", "unknown", "")
        state = FAILED if failed else RESUMABLE
        missing = (total or 0) - done
        nxt = RESUME.format(out=out) + f": only the {missing} missing task{'s' if missing != 1 else ''} run"
        if failed:
            nxt += f" (why they failed: the logs in {shlex.quote(str(path / PARTS / 'slurm'))})"
    tokenizer = plan.tokenizer.describe() if plan is not None else (
        f"{manifest.tokenizer.name} (vocabulary {manifest.tokenizer.vocab_size})" if manifest else "?")
    return PrepRow(name=path.resolve().name, dir=str(path.resolve()), kind="prepared dataset", job=job, state=state,
                   slurm_state=slurm_state, tasks_complete=done, tasks_total=total, tokenizer=tokenizer, next=nxt,
                   **_counts(manifest, records))


def table(rows: list[PrepRow], title: str) -> Any:
    """The rows as a rich table, then each dataset's tokenizer and next step (too long for cells)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                padding=(0, 1, 0, 0))
    for header in ("dataset", "job", "state", "tasks", "train tokens", "train docs", "val tokens", "val docs"):
        out.add_column(header, justify="left" if header in ("dataset", "job", "state") else "right", no_wrap=True)
    for row in rows:
        state = row.state if row.slurm_state in (None, "") else f"{row.state} ({row.slurm_state})"
        tasks = f"{'-' if row.tasks_complete is None else row.tasks_complete}/{row.tasks_total or '?'}"
        out.add_row(row.name, row.job, Text(state, style="red") if row.state == FAILED else state, tasks,
                    f"{row.train_tokens:,}", f"{row.train_documents:,}", f"{row.val_tokens:,}",
                    f"{row.val_documents:,}")
    if len(rows) == 1:
        return Group(out, Text(f"tokenizer: {rows[0].tokenizer}"), Text(f"next: {rows[0].next}"))
    notes = [Text(f"{row.name}: tokenizer {row.tokenizer}; next: {row.next}") for row in rows]
    return Group(out, *notes)
