"""Roll back in-process: reload the newest complete checkpoint that satisfies a predicate, skip sample ranges from
now on (here and in every later attempt), and record why. The checkpoints after it are an abandoned branch: they
are removed, so that a requeue can't resume on them. Every rank calls it at the same step."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.rundir import ckpt_layout as layout
from contract.rundir.events import record_event
from contract.rundir.skipped_samples import SkippedSamples
from train.observe.metrics import log


def rollback(ckpt: Any, skips: SkippedSamples, step: int, *, to: Callable[[int], bool],
             skip: list[tuple[int, int]], reason: str, kind: str = "rollback") -> dict[str, Any] | None:
    """Load the newest complete checkpoint whose step satisfies `to`; returns its trainer state (the caller makes
    its TrainState of it), or None when there is none (nothing is changed then). `skip`: global sample ranges
    [start, end) that no later step trains on; `reason` goes into RUN_DIR/skipped_samples.json and events.jsonl."""
    ckpt.wait()  # a save in flight completes (or fails) first: it may be the one to drop, or to return to
    target = ckpt.latest(where=to)
    if target is None:
        return None
    run_dir: Path = ckpt.run_dir
    is_main = ckpt.env.is_main
    dropped = [c for c in layout.list_checkpoints(run_dir) if c.step > target.step]
    if is_main:
        for c in dropped:
            layout.remove(c)
    saved = ckpt.load(target)
    skips.add_rollback(skip, reason, write=is_main)
    if is_main:
        from train.faults.preemption import slurm_job_id
        from train.faults.recovery import attempt, node_name

        record_event(run_dir, kind, attempt=attempt(), job=slurm_job_id(), host=node_name(), step=step,
                     to_step=target.step, steps_lost=step - target.step, reason=reason,
                     skipped=[[a, b] for a, b in skip], dropped=[c.step for c in dropped], ended=time.time())
        log.warning("rolled back from step %d to checkpoint step %d (%s); skipping samples %s%s", step, target.step,
                    reason, ", ".join(f"[{a}, {b})" for a, b in skip) or "none",
                    f"; removed the later checkpoints {[c.step for c in dropped]}" if dropped else "")
    return saved
