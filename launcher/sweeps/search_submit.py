"""A search on SLURM: its search.parallel workers as one job array (one task each, the node's ranks started by the
worker as local processes), submitted and left to run: the command returns at once (launcher.wait=true follows it)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.sbatch import executor_parameters, job_python, tasks_per_node
from contract.search import layout
from launcher.run.remote.hints import follow_command


def worker_parameters(cfg: DictConfig) -> dict[str, Any]:
    """One task per worker holding the node share a trial needs: the cluster's GPUs, and the CPUs of all its ranks.
    The batch shell passes the preemption signal on to the worker (contract/rules/sbatch.py passing_signal): its
    trial checkpoints and its task requeues (launcher/sweeps/search_worker.py)."""
    params = executor_parameters(cfg, ("the search worker", "its trial checkpoints and its task requeues"))
    ranks = tasks_per_node(cfg.cluster)
    params.update(nodes=1, ntasks_per_node=1, cpus_per_task=int(cfg.cluster.cpus_per_task) * ranks)
    return params


def submitted_line(job_id: str, parallel: int) -> str:
    """One worker is a plain job (submitit submits no array of one): its id has no _0 to follow."""
    if parallel == 1:
        return f"submitted job {job_id}: 1 search worker"
    return f"submitted array {job_id}: {parallel} search workers ({job_id}_0 .. {job_id}_{parallel - 1})"


def live_tasks(spec: layout.SearchSpec) -> list[str]:
    """The search's worker array tasks that SLURM still has queued or running."""
    if not spec.arrays or shutil.which("squeue") is None:
        return []
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(spec.arrays)], capture_output=True,
                         text=True, timeout=60)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def submit_workers(sweep_dir: Path, spec: layout.SearchSpec, cfg: DictConfig) -> int:
    import submitit

    from launcher.run import slurm
    from launcher.sweeps.search_worker import work

    executor = submitit.SlurmExecutor(folder=sweep_dir / "slurm", max_num_timeout=cfg.cluster.max_requeues,
                                      python=job_python(cfg))
    executor.update_parameters(**worker_parameters(cfg), array_parallelism=spec.parallel)
    executor.update_parameters(job_name=sweep_dir.name)
    try:
        jobs = executor.map_array(work, [str(sweep_dir)] * spec.parallel, list(range(spec.parallel)))
    except Exception as err:  # submitit wraps sbatch's refusal; SLURM's own words, one line
        message = " ".join(str(err).split())
        raise ConfigError(f"sbatch refused the search's workers: {message[-400:]}") from err
    array_id = str(jobs[0].job_id).split("_")[0]
    spec.arrays.append(array_id)
    layout.save_spec(sweep_dir, spec)
    status = follow_command("launcher.status", sweep_dir)
    print(f"{submitted_line(array_id, spec.parallel)}\n"
          f"sweep directory: {sweep_dir}\n"
          f"status:          {status}\n"
          f"plots:           {follow_command('launcher.report', sweep_dir)}")
    if cfg.launcher.wait:
        from launcher.sweeps.search_local import ended_without_best

        return slurm.follow_tasks([str(job.job_id) for job in jobs], status) or ended_without_best(sweep_dir)
    return 0


def preflight(cfg: DictConfig, sweep_dir: Path) -> None:
    """SLURM's verdict on the workers' resources before anything is created."""
    from submitit.slurm.slurm import _make_sbatch_string

    from launcher.run import slurm

    slurm.preflight(cfg)
    command = " ".join([job_python(cfg), "-u -m submitit.core._submit", shlex.quote(str(sweep_dir))])
    slurm.test_submission(_make_sbatch_string(command=command, folder=sweep_dir / "slurm", **worker_parameters(cfg)))
