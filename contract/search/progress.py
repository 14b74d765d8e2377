"""A trial's progress read from its run directory (a normal run's files, contract/rundir/): the steps it trained and
its steady time per step. Read by the worker when an attempt ends (launcher/sweeps/search_worker.py records both in
the study) and by the status of a trial still training (launcher/sweeps/search_status.py). Pure stdlib."""

from __future__ import annotations

import statistics
from pathlib import Path

from contract.rundir import ckpt_layout
from contract.rundir.events import WITHIN_ATTEMPT, read_events
from contract.rundir.metrics_file import read_metrics, training_rows


def steps_trained(run_dir: Path) -> int:
    """The newest step logged or checkpointed (a stop saves past the last logged step)."""
    rows = [r for r in read_metrics(run_dir) if "step" in r]
    latest = ckpt_layout.latest_complete_checkpoint(run_dir)
    steps = [int(rows[-1]["step"])] if rows else []
    return max(steps + ([latest.step] if latest else []), default=0)


def steady_step_seconds(run_dir: Path) -> float | None:
    """A trained step's wall time once running: the median, over consecutive logged training rows of one attempt, of
    the time between them per step. Start-up never falls between two rows of an attempt, and a pair of rows on either
    side of an attempt's end (a stop, a preemption: RUN_DIR/events.jsonl) holds a restart, so it is left out; the odd
    evaluation or checkpoint falls outside the median. None below two rows of one attempt."""
    ends = [float(e["time"]) for e in read_events(run_dir)
            if e.get("kind") not in WITHIN_ATTEMPT and isinstance(e.get("time"), int | float)]
    rows = [r for r in training_rows(read_metrics(run_dir)) if isinstance(r.get("time"), int | float)]
    pace = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:], strict=False)
            if b["step"] > a["step"] and b["time"] >= a["time"]
            and not any(a["time"] <= end <= b["time"] for end in ends)]
    return statistics.median(pace) if pace else None
