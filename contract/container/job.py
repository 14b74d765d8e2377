"""A SLURM job's container: what the sbatch script runs (submitit's `python`, srun's pyxis flags, setup and teardown
lines), shared by the training job (launcher/run/slurm.py), a sweep's array (launcher/sweeps/), a search's workers
and an evaluation job (contract/rules/eval_job_script.py, rendered again by training's rank 0). Torch-free.

Inside the image there is often no SLURM client, so a rank that would run `scontrol requeue` (a preemption's
checkpoint, a crash within cluster.max_failures) leaves the request in REQUEUE_DIR (contract/container/requeue.py)
and the batch shell, outside the container, requeues the job once srun returns.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from contract.container import requeue
from contract.container.runtimes import pyxis_srun_args, shell, wrap
from contract.container.spec import enabled, spec_from_config


def job_python(cfg: Any) -> str:
    """The shell words that start Python on every srun task: this interpreter, or the image's through its runtime."""
    if not enabled(cfg):
        return shlex.quote(sys.executable)
    return shell(wrap(spec_from_config(cfg)))


def srun_args(cfg: Any) -> list[str]:
    if not enabled(cfg) or cfg.container.runtime != "pyxis":
        return []
    return pyxis_srun_args(spec_from_config(cfg))


def setup_lines(cfg: Any) -> list[str]:
    """Before the ranks start: the requeue directory; pyxis's variables; enroot's container, once per node."""
    if not enabled(cfg):
        return []
    spec = spec_from_config(cfg)
    lines = [f"export {requeue.REQUEUE_DIR_ENV}={shlex.quote(requeue.requeue_dir(str(cfg.run.root)))}",
             f"mkdir -p \"${requeue.REQUEUE_DIR_ENV}\""]
    if spec.runtime == "pyxis":
        lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.env.items()]
    if spec.runtime == "enroot":
        name = spec.name  # letters, digits and dashes
        create = shlex.join(["flock", f"/tmp/{name}.lock", "bash", "-c", f"enroot list | grep -qx {name} || "
                             f"enroot create --name {name} {shlex.quote(spec.image)} >/dev/null"])
        # One task per node unpacks the image under the name every rank starts, unless a previous attempt (or
        # another job) did; the lock keeps two jobs on one node from unpacking into the same directory at once.
        lines.append("srun --nodes=\"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "
                     + shlex.quote(create) + " || exit 1")
    return lines


def teardown_lines(cfg: Any) -> list[str]:
    if not enabled(cfg):
        return []
    return requeue.teardown_lines()
