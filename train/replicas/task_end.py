"""After srun, in a replica group's batch shell (launcher/run/replica_slurm.py's teardown lines):

    python -m launcher.worker --group-ended RUN_DIR SRUN_EXIT_CODE

A group's rank that died without a word (a signal, the OOM killer: nothing in it could record or requeue) took the
whole group with it (srun's --kill-on-bad-exit), and the array task would end FAILED. Here the task's end is recorded
in the group's events.jsonl as a crash (no step lost when another group is alive to heal from) and the task requeued
alone (within cluster.max_failures, as train/faults/recovery.py does for a rank that raises); it then heals from a live
group (train/replicas/peers.py).
Nothing is done when a rank already recorded this attempt's end (its recovery claim), for bad input (exit 2), or when
a user cancelled the task. No host is left out: a process killed by a signal says nothing against its node (a node
that fails is SLURM's NODE_FAIL, and SLURM requeues the task without it itself).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from omegaconf import OmegaConf

from contract.errors import EXIT_BAD_INPUT
from contract.rundir import replicas as contract
from contract.rundir.metrics_file import read_metrics
from train.faults.preemption import slurm_job_id
from train.faults.recovery import attempt, recover
from train.replicas.peers import live_groups


def _cause(code: int) -> str:
    """srun's exit code in words: 128+N (or N above 128 from a task) is signal N."""
    number = code - 128 if code > 128 else 0
    try:
        return f"a rank was killed by {signal.Signals(number).name} (srun exit code {code})"
    except ValueError:
        return f"a rank exited with code {code} without recording why"


def group_ended(main_dir: str | Path, code: int) -> int:
    group = int(os.environ.get(contract.GROUP_ENV, "0"))
    run_dir = contract.group_dir(Path(main_dir), group)
    job = slurm_job_id()
    if job is None or code in (0, EXIT_BAD_INPUT):
        return 0
    if (run_dir / f".recovery-{job}-{attempt()}").exists():
        return 0  # a rank recorded this attempt's end and requeued it (or chose not to)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    step = int(rows[-1]["step"]) if rows else 0
    started = float(os.environ.get(contract.TASK_STARTED_ENV) or time.time())
    found = contract.read_lighthouse(Path(main_dir))
    live = live_groups(str(found["address"])) if found and found.get("address") else None
    heals = bool((live or set()) - {group})
    print(f"batch shell: replica group {group}: {_cause(code)}; its task is requeued alone and "
          + ("heals from a live group" if heals else "resumes from its newest checkpoint (no other group is alive)"),
          flush=True)
    recover(cfg, run_dir, "crashed", step, None, RuntimeError(_cause(code)), started=started, is_main=True,
            lost_steps=0 if heals else None, group=group)
    return 0
