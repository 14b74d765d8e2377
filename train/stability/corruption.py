"""What follows silent data corruption (a replica check that failed, train/stability/replicas.py), on every rank.

    - a `corruption` event (step, the disagreeing ranks and their hosts, each one's majority, the tensors that
      differ) and the same in the log;
    - under SLURM, when the majority names the hosts: the checkpoints newer than the newest one verified consistent
      are removed and the job is requeued without every host the majority named (each while the partition has a
      node to spare), as for a crashed rank (train/faults/recovery.py), so that the next attempt resumes from the
      verified checkpoint on other hardware; a failure against cluster.max_failures, as a crash is;
    - otherwise (a local run, or no majority to name a host): an in-process rollback to the newest checkpoint
      verified consistent, no samples skipped (the data was fine), and training goes on; the attempt goes on too,
      so this is no failure against cluster.max_failures (contract/rundir/events.py is_failure);
    - no verified checkpoint, or stability.max_rollbacks reached: the run stops in one line naming the hosts.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from contract.errors import EXIT_DIVERGED
from contract.rundir import ckpt_layout as layout
from contract.rundir.events import record_event
from contract.rundir.skipped_samples import SkippedSamples
from train.observe.metrics import log
from train.stability.replicas import Disagreement, ReplicaCheck
from train.stability.rollback import rollback

# The loop's action for it, above the stop agreement's NOTHING, ROLLBACK and STOP (train/stability/monitor.py).
CORRUPTION = 3
EVENT_KIND = "corruption"


def respond(found: Disagreement, check: ReplicaCheck, ckpt: Any, skips: SkippedSamples, cfg: Any,
            max_rollbacks: int, step: int) -> dict[str, Any] | Any:
    """A checkpoint's trainer state to go on from, or the StopOutcome that ends this attempt."""
    from train.faults.preemption import StopOutcome, slurm_job_id
    from train.faults.recovery import attempt, recover

    is_main, run_dir = ckpt.env.is_main, ckpt.run_dir
    what = check.describe(found)
    hosts = [check.hosts[r] for r in found.named]
    culprits = list(dict.fromkeys(check.hosts[r] for r in found.bad))  # each once, in rank order
    details: dict[str, Any] = {"ranks": found.bad, "suspects": found.suspects, "hosts": hosts, "tensors": found.tensors,
               "majority": {str(r): holders for r, holders in found.majority.items()}}

    def is_verified(s: int) -> bool:
        return layout.verified(layout.CheckpointDir(s, layout.step_dir(run_dir, s)))

    if is_main:
        log.error("silent data corruption found at step %d: %s", step, what)
    job = slurm_job_id()
    limit = skips.rollbacks >= max_rollbacks
    if job is not None and cfg.get("cluster") is not None and found.bad and not limit:
        ckpt.wait()  # a save in flight completes: it was verified before it began, or it is dropped below
        target = ckpt.latest(where=is_verified)
        if target is not None:
            if is_main:
                for c in layout.list_checkpoints(run_dir):
                    if c.step > target.step:
                        layout.remove(c)
                log.error("requeueing without %s: the next attempt resumes from step %d, the newest checkpoint "
                          "verified consistent", ", ".join(culprits), target.step)
                recover(cfg, run_dir, EVENT_KIND, step, culprits[0], started=_process_start(), is_main=True,
                        culprits=culprits, to_step=target.step, **details)
            return StopOutcome(1, None, stopped=True, kind=EVENT_KIND)
    if is_main:
        record_event(run_dir, EVENT_KIND, attempt=attempt(), job=job, step=step, **details)
    if not limit:
        saved = rollback(ckpt, skips, step, to=is_verified, skip=[],
                         reason=f"silent data corruption at step {step}: {what}")
        if saved is not None:
            return saved
    why = (f"after {skips.rollbacks} rollbacks (stability.max_rollbacks={max_rollbacks})" if limit
           else "and no checkpoint verified consistent to roll back to")
    line = (f"error: stopped at step {step}: silent data corruption ({what}), {why}. Check the hosts "
            f"{', '.join(sorted(set(hosts)))} (GPU memory, ECC errors), then run the same command to resume from the "
            "newest checkpoint")
    if is_main:
        from train.faults.recovery import _to_rank_log

        _to_rank_log(logging.ERROR, line, None)
        print(line, file=sys.stderr, flush=True)
    return StopOutcome(EXIT_DIVERGED, None, stopped=True)


def _process_start() -> float:
    """When this attempt's process started (its end's event counts the time from there)."""
    import psutil

    return float(psutil.Process().create_time())
