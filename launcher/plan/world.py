"""How many ranks a run has and where they land: the world size, ranks per node, the GPUs on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.sbatch import tasks_per_node


def local_gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def local_gpu_capability() -> tuple[int, int] | None:
    """The lowest compute capability of this machine's GPUs (nvidia-smi), None where it has none or can't say."""
    if local_gpu_count() == 0 or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = []
    for line in out.stdout.split():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append((int(major), int(minor)))
    return min(found) if found else None


def has_gpus(cfg: DictConfig) -> bool:
    if cfg.cluster is not None:
        return int(cfg.cluster.gpus_per_node) > 0
    return local_gpu_count() > 0


def ranks_on_gpus(cfg: DictConfig) -> bool:
    """Whether the ranks compute on GPUs (train/distributed.py device_for: NCCL where there are GPUs)."""
    return has_gpus(cfg) and (cfg.cluster is not None or cfg.local.backend != "gloo")


def world_size(cfg: DictConfig) -> int:
    if cfg.launcher.prepare_only:
        if "SLURM_NTASKS" not in os.environ:
            raise ConfigError("launcher.prepare_only=true runs inside an allocation: use it from an sbatch script")
        return int(os.environ["SLURM_NTASKS"])
    if cfg.cluster is not None:
        return int(cfg.cluster.nodes) * tasks_per_node(cfg.cluster)
    if cfg.local.nproc is not None:
        return int(cfg.local.nproc)
    return max(1, local_gpu_count())

