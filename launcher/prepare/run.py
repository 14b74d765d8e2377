"""A local preparation: the output directory, the worker pool, resume, and finalize (manifest.json written last).

Re-running the same command resumes: tasks whose completion record is there (and whose shards have the sizes it
lists) are skipped, the others are written again. A bad input found while reading stops every task, and what this
run wrote is removed (the directory too when this run created it): nothing is left half-done. Ctrl-C stops at the
next batch, keeps the finished tasks, and the same command resumes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from contract.data.manifest import (
    MANIFEST,
    SPLITS,
    Manifest,
    Shard,
    Source,
    build_manifest,
    write_json_atomic,
    write_manifest,
)
from contract.errors import ConfigError
from launcher.prepare.jobs import refuse_live_jobs
from launcher.prepare.plan import PARTS, PLAN, Plan, difference, load_plan
from launcher.prepare.pool import Created, run_tasks
from launcher.prepare.shards import completed_record, record_path, shard_name


def _ours(out: Path) -> bool:
    return (out / PARTS).exists() or (out / MANIFEST).exists()


def _nothing_kept(out: Path) -> bool:
    """A preparation whose plan is gone holds nothing of value when it has no manifest and no task's completion
    record (a task counts only by its record, written last): a kill before the plan was written left it so."""
    return not (out / MANIFEST).exists() and not any((out / PARTS).glob("[0-9]*.json"))


def refuse_a_file(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a directory for the prepared dataset")


@contextmanager
def claimed(plan: Plan, overwrite: bool) -> Iterator[Created]:
    """Hold `plan.out` for this plan: create it, or resume it (the same plan), or with --overwrite replace another
    preparation; refuse a directory holding something else, or one that another preparation is writing (here or
    as SLURM jobs). The directory is locked for the block; a ConfigError raised in it undoes what this run wrote."""
    out = Path(plan.out)
    refuse_a_file(out)
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
    out = Path(plan.out)
    if any(out.iterdir()):
        if not _ours(out):
            raise ConfigError(
                f"--out {out} is not empty and holds no prepared dataset: give a new or empty directory"
            )
        refuse_live_jobs(plan)
        old = load_plan(out) if (out / PARTS / PLAN).exists() else None
        if old is None and _nothing_kept(out):  # killed before its plan was written: start over
            _remove_preparation(out)
        elif old is None or old.fingerprint != plan.fingerprint:
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


# ---------------------------------------------------------------- the worker processes


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
        plan.options.sft,
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
