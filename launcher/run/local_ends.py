"""The local launcher's record of an attempt's end that its ranks could not record: the launcher outlives them.

Rank 0 records how its attempt ended (train/faults/recovery.py). Where it could not, the launcher does, once every worker
has ended: workers it stopped at once on a second Ctrl-C (`killed`), a rank 0 that died without a word (`crashed`:
SIGKILL, a segfault), an environment failure (`environment`, launcher/run/local.py). An attempt whose rank 0 died
before it numbered the attempt is numbered here, so that status and goodput count every attempt.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from contract.rundir import ckpt_layout, metrics_file
from contract.rundir.events import local_attempt_end, local_attempt_of, record_event, start_local_attempt

# Ends a rank 0 reaches by itself, its checkpoint (if any) written: its workers are only exiting after one.
SETTLED_ENDS = ("stopped", "finished", "diverged", "preempted")


def this_attempt(run_dir: Path, rank0_pid: int, started: float) -> tuple[int, float]:
    """The number and start time of the attempt whose rank 0 is `rank0_pid`, numbered now (as started at
    `started`) when rank 0 died before it could."""
    found = local_attempt_of(run_dir, rank0_pid)
    if found is not None and found[1] >= started:  # not an older attempt's rank 0 that had the same pid
        return found
    return start_local_attempt(run_dir, pid=rank0_pid, start_time=started), started


def settled(run_dir: Path, rank0_pid: int, started: float) -> bool:
    """Whether the attempt whose rank 0 is `rank0_pid` has recorded an end it reached by itself (SETTLED_ENDS):
    stopping its workers at once would change nothing but the record."""
    try:
        found = local_attempt_of(run_dir, rank0_pid)
        end = local_attempt_end(run_dir, found[0]) if found is not None and found[1] >= started else None
    except OSError:
        return False
    return end is not None and end.get("kind") in SETTLED_ENDS


def last_logged_step(run_dir: Path) -> int | None:
    try:
        rows = metrics_file.read_metrics(run_dir)
    except OSError:
        return None
    steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int)]
    return max(steps, default=None)


def record_end(run_dir: Path, rank0_pid: int, started: float, kind: str, **fields: Any) -> dict[str, Any] | None:
    """Record `kind` as the end of that attempt unless it has one: the step it reached (the newest logged, never
    below the newest complete checkpoint) and the steps since that checkpoint, lost. Returns the event recorded;
    None when the attempt had its end already, or the run directory takes no write."""
    try:
        number, start = this_attempt(run_dir, rank0_pid, started)
        if local_attempt_end(run_dir, number) is not None:
            return None
        latest = ckpt_layout.latest_complete_checkpoint(run_dir)
        saved = latest.step if latest is not None else 0
        step = max(last_logged_step(run_dir) or 0, saved)
        event = {"attempt": number, "job": None, "host": socket.gethostname(), "step": step,
                 "steps_lost": step - saved, "started": start, "ended": time.time(), **fields}
        record_event(run_dir, kind, **event)
    except OSError:
        return None  # the run directory went away or turned read-only: the launcher's line is all there is
    return {"kind": kind, **event}
