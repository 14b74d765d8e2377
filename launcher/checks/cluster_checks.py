"""Checks of a cluster config that need no cluster: launch method, time limit, signal, secrets."""

from __future__ import annotations

import re
import signal

from omegaconf import DictConfig

from contract.errors import ConfigError

# Environment variable names that must never be written into an sbatch script or a config dump.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# Signals a rank cannot catch, or that would not mean "checkpoint now" (TERM is scancel's: it saves and ends).
UNUSABLE_SIGNALS = {"KILL", "STOP", "CONT", "CHLD", "PIPE", "SEGV", "TERM", "INT"}
# sbatch options the launcher sets from the cluster config: extra_sbatch must not override them.
MANAGED_SBATCH = {"time": "cluster.time_limit_min", "t": "cluster.time_limit_min", "requeue": "(always on)",
                  "signal": "cluster.signal and cluster.signal_lead_s", "nodes": "cluster.nodes", "N": "cluster.nodes",
                  "ntasks_per_node": "cluster.tasks_per_node", "ntasks-per-node": "cluster.tasks_per_node",
                  "gpus_per_node": "cluster.gpus_per_node", "gpus-per-node": "cluster.gpus_per_node",
                  "partition": "cluster.partition", "p": "cluster.partition", "account": "cluster.account",
                  "qos": "cluster.qos", "cpus_per_task": "cluster.cpus_per_task",
                  "cpus-per-task": "cluster.cpus_per_task", "job_name": "run.name", "output": "(the run directory)",
                  "error": "(the run directory)", "mem": "cluster.mem_per_task_gb"}


def validate_cluster(cfg: DictConfig) -> None:
    c = cfg.cluster
    if c.launch != "srun":
        raise ConfigError(
            f"cluster.launch={c.launch}: under SLURM the preemption signal ({c.signal}) would kill torchrun's agent "
            "before the ranks could checkpoint; use cluster.launch=srun (one srun task per GPU)"
        )
    if c.time_limit_min * 60 <= c.signal_lead_s:
        raise ConfigError(
            f"cluster.time_limit_min={c.time_limit_min} is not longer than the {c.signal_lead_s} s signal lead "
            f"time: raise cluster.time_limit_min above {c.signal_lead_s // 60 + 1} or lower cluster.signal_lead_s"
        )
    if c.backend == "nccl" and c.gpus_per_node < 1:
        raise ConfigError("cluster.backend=nccl needs GPUs: set cluster.gpus_per_node or cluster.backend=gloo")
    managed = [k for k in c.extra_sbatch if str(k) in MANAGED_SBATCH]
    if managed:
        k = managed[0]
        raise ConfigError(f"cluster.extra_sbatch.{k} overrides what slurmtrain sets from {MANAGED_SBATCH[str(k)]}: "
                          "drop it and set that key instead")
    if c.gpus_per_node and c.tasks_per_node and c.tasks_per_node != c.gpus_per_node:
        raise ConfigError(f"cluster.tasks_per_node={c.tasks_per_node} with cluster.gpus_per_node={c.gpus_per_node}: "
                          "one rank per GPU; drop cluster.tasks_per_node (or set it to the GPU count)")
    if c.gpus_per_node and not c.gpu_memory_gb:
        raise ConfigError(f"cluster={c.name} has GPUs but no cluster.gpu_memory_gb: set it (80 for an H100 or "
                          "A100 80GB) so the plan can check the memory")
    name = str(c.signal).upper().removeprefix("SIG")
    if f"SIG{name}" not in signal.Signals.__members__ or name in UNUSABLE_SIGNALS:
        raise ConfigError(f"cluster.signal={c.signal} is not a signal the ranks can catch: use USR1")
    secrets = [k for k in c.env if SECRET_NAME.search(k)]
    secrets += [line for line in c.setup if re.search(r"\b\w*(KEY|TOKEN|SECRET|PASSW\w*|CREDENTIAL)\w*=", line,
                                                       re.IGNORECASE)]
    secrets += [f"{k}={v}" for k, v in c.extra_sbatch.items() if SECRET_NAME.search(f"{k} {v}")]
    if secrets:
        raise ConfigError(
            f"cluster.env/setup/extra_sbatch hold {', '.join(s.split('=')[0] for s in secrets)}: secrets are never "
            "written into sbatch scripts; "
            "export them in your shell before submitting (sbatch passes your environment to the job)"
        )
