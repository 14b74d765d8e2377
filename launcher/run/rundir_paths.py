"""What run.overwrite=true deletes in a run directory (launcher/run/rundir.py deletes them; launcher/plan/init_from.py refuses
weights that lie among them), and the refusal of an existing run directory that can't be written."""

from __future__ import annotations

import os
from pathlib import Path

from contract.errors import ConfigError

CLEARED_BY_OVERWRITE = ("checkpoints", "metrics.jsonl", "wandb", "events.jsonl", "local_attempts.txt")


def check_writable(run_dir: Path) -> None:
    """An existing run directory the launch would write into: refused before anything in it is changed. A read-only
    file system stops even root (access(2) answers EROFS); permissions stop everyone else."""
    if not run_dir.is_dir():
        return  # created later under run.root, whose writability launcher/checks/input_checks.py checks
    if os.statvfs(run_dir).f_flag & os.ST_RDONLY:
        why = "it is on a read-only file system"
    elif not os.access(run_dir, os.W_OK | os.X_OK):
        why = "it is not writable for you"
    else:
        return
    raise ConfigError(f"the run directory {run_dir} can't be written ({why}): make it writable (remount it "
                      "read-write, or chmod u+w), or pick another run.name or run.root to start a run elsewhere")
