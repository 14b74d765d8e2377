"""A requeue asked for inside a container, done outside it: the image usually has no SLURM client.

A rank that would run `scontrol requeue JOB` writes JOB to REQUEUE_DIR/$SLURM_JOB_ID instead (ask_host) and its
attempt ends as it would have; the batch shell, which runs on the host, requeues the job once srun has returned
(teardown_lines). REQUEUE_DIR is under the run root, which every container mounts.
"""

from __future__ import annotations

import os
from pathlib import Path

REQUEUE_DIR_ENV = "SLURMTRAIN_REQUEUE_DIR"


def requeue_dir(run_root: str) -> str:
    return str(Path(run_root) / ".requeue")


def ask_host(job_id: str) -> bool:
    """Inside a container under SLURM: leave the requeue to the batch shell (True); elsewhere False."""
    folder, own = os.environ.get(REQUEUE_DIR_ENV), os.environ.get("SLURM_JOB_ID")
    if not folder or not own:
        return False
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / own).write_text(f"{job_id}\n")
    return True


def teardown_lines() -> list[str]:
    """Right after srun (submitit puts these there): requeue what a rank asked for, and end with srun's own exit
    code, which the job's state reports."""
    return ["srun_code=$?",
            f'request="${REQUEUE_DIR_ENV}/$SLURM_JOB_ID"',
            'if [ -f "$request" ]; then job=$(cat "$request"); rm -f "$request"; '
            'echo "batch shell: requeueing job $job as a rank asked" >&2; scontrol requeue "$job"; fi',
            'exit "$srun_code"']
