"""A job's sbatch parameters from its config, in the names submitit's SlurmExecutor takes: the training job's
(launcher/run/slurm.py), a sweep's array (launcher/sweeps/) and an evaluation job's, which training's rank 0
submits (contract/rules/eval_job_script.py, train/evaluation/submit.py). Torch-free.
"""

from __future__ import annotations

import shlex
from typing import Any

from omegaconf import DictConfig


def tasks_per_node(cluster: Any) -> int:
    if cluster.tasks_per_node:
        return int(cluster.tasks_per_node)
    return max(1, int(cluster.gpus_per_node))



def signal_name(cluster: Any) -> str:
    return cluster.signal.removeprefix("SIG")


def executor_parameters(cfg: DictConfig) -> dict[str, Any]:
    """The sbatch parameters, in the names submitit's SlurmExecutor takes."""
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
        "srun_args": ["--kill-on-bad-exit=1"],
        "setup": setup_lines(c),
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


def setup_lines(c: Any) -> list[str]:
    sig = signal_name(c)
    lines = [
        # `scancel --signal=USR1 --full` also signals the batch shell; without a trap bash would die and take
        # the job with it before the ranks had checkpointed.
        f"trap 'echo \"batch shell: got SIG{sig}; the training ranks checkpoint and requeue\" >&2' {sig}",
        "export WANDB_RESUME=allow",
    ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in c.env.items()]
    lines += list(c.setup)
    return lines
