"""A job's sbatch parameters from its config, in the names submitit's SlurmExecutor takes: the training job's
(launcher/run/slurm.py), a sweep's array (launcher/sweeps/) and an evaluation job's, which training's rank 0
submits (contract/rules/eval_job_script.py, train/evaluation/submit.py); with a container, its srun flags, setup
and teardown lines, and job_python, the command that starts Python on every task (contract/container/job.py).
Torch-free.
"""

from __future__ import annotations

import shlex
from typing import Any

from omegaconf import DictConfig

from contract.container import job as container_job


def job_python(cfg: DictConfig) -> str:
    """What starts Python on every srun task: this interpreter, or the image's through its container runtime."""
    return container_job.job_python(cfg)


def tasks_per_node(cluster: Any) -> int:
    if cluster.tasks_per_node:
        return int(cluster.tasks_per_node)
    return max(1, int(cluster.gpus_per_node))



def signal_name(cluster: Any) -> str:
    return cluster.signal.removeprefix("SIG")


# Who srun's tasks are and what they do on the preemption signal, as the batch shell's line says it.
TRAINING_RANKS = ("the training ranks", "they checkpoint and requeue")


def executor_parameters(cfg: DictConfig, tasks: tuple[str, str] = TRAINING_RANKS) -> dict[str, Any]:
    """The sbatch parameters, in the names submitit's SlurmExecutor takes; `tasks`: who srun's tasks are and what
    they do on the preemption signal (the batch shell passes it on and says so)."""
    c = cfg.cluster
    sig = signal_name(c)
    params: dict[str, Any] = {
        "job_name": cfg.run.name,
        "nodes": c.nodes,
        "ntasks_per_node": tasks_per_node(c),
        "cpus_per_task": c.cpus_per_task,
        "time": c.time_limit_min,
        "partition": c.partition,
        "account": c.account,
        "qos": c.qos,
        "constraint": c.constraint,
        "exclusive": True if c.exclusive else None,
        "stderr_to_stdout": False,
        # One failed rank ends the step instead of leaving the others hanging in a collective.
        "srun_args": ["--kill-on-bad-exit=1", *container_job.srun_args(cfg)],
        # container=...: what the ranks start in (contract/container/job.py); nothing without one.
        "setup": setup_lines(c, tasks) + container_job.setup_lines(cfg),
        "teardown": container_job.teardown_lines(cfg) or None,
        "additional_parameters": {
            # Our signal, not submitit's USR2: every rank handles it, not rank 0 alone.
            "signal": f"{sig}@{c.signal_lead_s}",
            "requeue": True,
            **dict(c.extra_sbatch),
        },
    }
    if c.gpus_per_node:
        params["gpus_per_node"] = c.gpus_per_node
    if c.mem_per_task_gb:
        params["mem"] = _mem(c.mem_per_task_gb * tasks_per_node(c))
    return {k: v for k, v in params.items() if v is not None}


def _mem(gb: float) -> str:
    return f"{int(gb)}GB" if gb == int(gb) else f"{int(gb * 1024)}MB"


# srun in the background, bash waiting for it (and returning srun's exit code): bash runs a trap only once its
# foreground command has ended, so a signal to the batch shell alone (`scancel --signal=USR1 --batch`) was held until
# the job ended, and its line said the ranks checkpoint and requeue while nothing did either. Waiting, bash runs the
# trap at once, and srun forwards the signal it is sent to every task. Written so that `set -eu` scripts run it too.
# A `wait` that a trap interrupted returns 128 + the signal, not srun's code: the last `wait` collects srun's own.
SRUN_IN_BACKGROUND = ('srun() { command srun "$@" & SLURMTRAIN_SRUN=$!; while kill -0 "$SLURMTRAIN_SRUN" 2>/dev/null; '
                      'do wait "$SLURMTRAIN_SRUN" || true; done; local code=0; wait "$SLURMTRAIN_SRUN" || code=$?; '
                      'return "$code"; }')


def passing_signal(sig: str, to: str, then: str) -> list[str]:
    """The batch shell's lines that pass `sig` on to srun's tasks (`to`: who they are; `then`: what they do on it).
    Without a trap bash would die of the signal and take the job with it before the ranks had checkpointed."""
    trap = (f'if kill -0 "${{SLURMTRAIN_SRUN:-}}" 2>/dev/null; then echo "batch shell: got SIG{sig}: passed to {to}: '
            f'{then}" >&2; kill -{sig} "$SLURMTRAIN_SRUN" 2>/dev/null || true; else echo "batch shell: got SIG{sig} '
            f'before {to} started: not passed on" >&2; fi')
    return [SRUN_IN_BACKGROUND, f"trap {shlex.quote(trap)} {sig}"]


def setup_lines(c: Any, tasks: tuple[str, str] = TRAINING_RANKS) -> list[str]:
    lines = [
        *passing_signal(signal_name(c), *tasks),
        "export WANDB_RESUME=allow",
    ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in c.env.items()]
    lines += list(c.setup)
    return lines
