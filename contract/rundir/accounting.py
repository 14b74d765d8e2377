"""What SLURM says about a job: its queue state (squeue), every attempt it made and how long each waited in the queue
(sacct -D).

Plain data out, no formatting: `launcher.status` turns it into rows. A missing or failing client (no SLURM here,
slurmdbd down) answers None, never raises, so the caller can show `unknown` instead of a traceback.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 30
SACCT_FIELDS = "JobID,State,ElapsedRaw,AllocTRES,AllocCPUS"
# `57_[0-3]` or `57_[0,2-5%2]`: an array whose tasks have not been split off yet (pending or cancelled unstarted).
UNSPLIT_ARRAY = re.compile(r"^(\d+)_\[([^\]]*)\]$")


@dataclass(frozen=True)
class Attempt:
    """One row of `sacct -D -X`: a requeued job shows one row per attempt, oldest first."""

    job_id: str
    state: str
    elapsed_s: int
    gpus: int
    cpus: int


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def queue_state(job_id: str) -> str | None:
    """`RUNNING`, `PENDING`, ... while queued; "" once the job left the queue; None when squeue can't answer."""
    out = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if out is None:
        return None
    if out.returncode != 0:
        # slurmctld forgets finished jobs after MinJobAge and then calls the id invalid: not queued.
        return "" if "Invalid job id" in out.stderr else None
    lines = out.stdout.split()
    return lines[0] if lines else ""


def gpus_in_tres(tres: str) -> int:
    """GPUs in an AllocTRES string: `gres/gpu=N`, or the sum of typed `gres/gpu:a100=N` entries when alone."""
    counts = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
    if "gres/gpu" in counts:
        return _int(counts["gres/gpu"])
    return sum(_int(v) for k, v in counts.items() if k.startswith("gres/gpu:"))


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def parse_sacct(text: str) -> list[Attempt]:
    """Rows of `sacct -n -P -o JobID,State,ElapsedRaw,AllocTRES,AllocCPUS`."""
    found = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 5 or not fields[0]:
            continue
        job_id, state, elapsed, tres, cpus = fields
        # `CANCELLED by 0` -> `CANCELLED`
        found.append(Attempt(job_id, (state.split() or ["UNKNOWN"])[0], _int(elapsed), gpus_in_tres(tres), _int(cpus)))
    return found


def _sacct(job_ids: list[str]) -> list[Attempt] | None:
    out = _run(["sacct", "-j", ",".join(job_ids), "-D", "-X", "-n", "-P", "-o", SACCT_FIELDS])
    if out is None or out.returncode != 0:
        return None
    return parse_sacct(out.stdout)


def _in_unsplit_array(record_id: str, task_id: str) -> bool:
    match = UNSPLIT_ARRAY.match(record_id)
    array, _, task = task_id.partition("_")
    if not match or match.group(1) != array or not task.isdigit():
        return False
    for part in match.group(2).split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and int(low) <= int(task) <= int(high or low):
            return True
    return False


def attempts(job_ids: list[str]) -> dict[str, list[Attempt]] | None:
    """Every attempt of each job id (plain `42` or array task `57_3`), oldest first; one sacct call.

    sacct knows an array task by its own id only once it has been split off the array; before that (pending,
    or cancelled before it started) the array's `57_[0-3]` record stands for it.
    """
    if not job_ids:
        return {}
    rows = _sacct(job_ids)
    if rows is None:
        return None
    found = {job_id: [a for a in rows if a.job_id == job_id] for job_id in job_ids}
    unsplit = [job_id for job_id, mine in found.items() if not mine and "_" in job_id]
    if unsplit:
        arrays = _sacct(sorted({job_id.split("_")[0] for job_id in unsplit})) or []
        for job_id in unsplit:
            found[job_id] = [a for a in arrays if _in_unsplit_array(a.job_id, job_id)]
    return found


QUEUE_FIELDS = "JobID,Submit,Start"


def parse_queue_times(text: str) -> dict[str, list[float]]:
    """Rows of `sacct -n -P -o JobID,Submit,Start`: each job's attempts' waits in the queue (Start - Submit, in
    seconds; a requeued attempt's Submit is its requeue), oldest first; an attempt not started yet is left out."""
    from datetime import datetime

    waits: dict[str, list[float]] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 3 or not fields[0]:
            continue
        try:
            submit, start = datetime.fromisoformat(fields[1]), datetime.fromisoformat(fields[2])
        except ValueError:  # Unknown, None: not started
            continue
        waits.setdefault(fields[0], []).append(max(0.0, (start - submit).total_seconds()))
    return waits


def queue_waits(job_ids: list[str]) -> dict[str, list[float]] | None:
    """Each job's attempts' waits in the queue (parse_queue_times), one sacct call; None when sacct can't answer."""
    if not job_ids:
        return {}
    out = _run(["sacct", "-j", ",".join(job_ids), "-D", "-X", "-n", "-P", "-o", QUEUE_FIELDS])
    if out is None or out.returncode != 0:
        return None
    return parse_queue_times(out.stdout)
