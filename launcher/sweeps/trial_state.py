"""What a trial the study holds as RUNNING is doing now. Optuna's RUNNING only says no worker told the study how the
trial ended: its worker may be training it, queued again after a requeue, or gone (a Ctrl-C, an scancel), leaving
it checkpointed for the same command to resume. The workers' files (contract/search/layout.py) say who holds it;
SLURM's queue and the trial's run directory (its recorded ends, its checkpoints) say the rest."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.rundir import accounting, ckpt_layout
from contract.rundir.events import WITHIN_ATTEMPT, read_events
from contract.search import layout

CLEAN_STOPS = ("stopped", "preempted", "cancelled")
# squeue's states of a task waiting to run (again, after a requeue: held, or pending its begin time).
QUEUED_AGAIN = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


def holders(sweep_dir: Path) -> dict[int, dict[str, Any]]:
    """trial number -> the state file of the worker that holds it (workers/worker_I.json)."""
    held = {}
    for path in sorted((Path(sweep_dir) / layout.WORKERS_DIR).glob("worker_*.json")):
        state = layout.read_json(path, {})
        if isinstance(state.get("trial"), int):
            held[state["trial"]] = state
    return held


def pid_alive(host: Any, pid: Any) -> bool:
    """A local worker's process, on this host, still there."""
    if host != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_state(run_dir: Path, holder: dict[str, Any] | None,
               queue_state: Callable[[str], str | None] | None = None) -> tuple[str, str]:
    """(state, note) of a RUNNING trial: running, pending (its worker's task queued again), stopped (checkpointed, the
    last attempt ended cleanly) or interrupted (it ended otherwise), the note saying what the same command does."""
    latest = ckpt_layout.latest_complete_checkpoint(run_dir)
    at = f"from step {latest.step}" if latest else "again (no checkpoint)"
    job = (holder or {}).get("job")
    if job:
        queued = (queue_state or accounting.queue_state)(str(job))
        if queued in QUEUED_AGAIN:
            return "pending", f"its worker {job} is queued again; the trial {'resumes' if latest else 'starts'} {at}"
        if queued:  # RUNNING, COMPLETING, ...
            return "running", ""
    elif holder is not None and pid_alive(holder.get("host"), holder.get("pid")):
        return "running", ""
    ends = [e for e in read_events(run_dir) if e.get("kind") not in WITHIN_ATTEMPT]
    if ends and ends[-1].get("kind") in CLEAN_STOPS and latest is not None:
        return "stopped", f"checkpointed at step {latest.step}; the same search command resumes it"
    how = f"its last attempt ended {ends[-1]['kind']}" if ends else "its worker is gone"
    return "interrupted", f"{how}; the same search command {'resumes' if latest else 'starts'} it {at}"
