"""An evaluation job's config and sbatch script (eval.async_jobs=true; the design: contract/rules/eval_jobs.py):
the training job's settings with the job's own resources, running `python -m launcher.worker --evaluate` on every
rank. Rendered at launch (SLURM's verdict on it before training queues: launcher/run/slurm.py) and by training's
rank 0 when it submits the job (train/evaluation/submit.py). Torch-free.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.rules.eval_jobs import tasks_per_node
from contract.rules.sbatch import executor_parameters, job_python
from contract.rules.sbatch import tasks_per_node as cluster_tasks_per_node
from contract.rundir import eval_results


def job_config(cfg: DictConfig, step: int) -> DictConfig:
    """The run's config with the evaluation job's resources as its cluster section and its own job name."""
    e, c = cfg.eval, cfg.cluster
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(out, DictConfig)
    tasks = tasks_per_node(cfg, cluster_tasks_per_node(c))
    with open_dict(out):
        out.run.name = f"{cfg.run.name}-eval{step}"
        out.cluster.nodes = int(e.job_nodes)
        out.cluster.tasks_per_node = tasks
        if int(c.gpus_per_node) > 0:
            out.cluster.gpus_per_node = tasks  # one GPU per rank
        out.cluster.partition = e.job_partition or c.partition
        out.cluster.qos = e.job_qos or c.qos
        out.cluster.time_limit_min = int(e.job_time_limit_min or c.time_limit_min)
    return out


def render_script(cfg: DictConfig, run_dir: Path, step: int, config: Path | None = None) -> str:
    """The evaluation job's sbatch script: the training job's settings (setup lines, environment, the preemption
    signal and --requeue) with the job's own resources, running the evaluation entry on every rank (`config`:
    launcher.evaluate's config for it, eval/requests/step_N.yaml, else the checkpoint's own)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = eval_results.eval_dir(run_dir) / "slurm"
    job = job_config(cfg, step)
    command = " ".join([job_python(job), "-u -m launcher.worker --evaluate",
                        shlex.quote(str(Path(run_dir).resolve())), str(step)]
                       + ([shlex.quote(str(Path(config).resolve()))] if config is not None else []))
    ranks = ("the evaluation ranks", "before the pass the job requeues, during it the pass finishes")
    return _make_sbatch_string(command=command, folder=folder, **executor_parameters(job, ranks))
