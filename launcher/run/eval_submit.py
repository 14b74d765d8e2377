"""Submitting an evaluation job (eval.async_jobs=true; the design: launcher/run/eval_jobs.py): its sbatch script, rendered
as the training job's is (launcher/run/slurm.py) with the job's own resources, and the sbatch call training's rank 0
makes once a checkpoint is complete. Torch-free.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from launcher.observe import eval_results
from launcher.plan.launch_plan import Plan
from launcher.plan.world import tasks_per_node as cluster_tasks_per_node
from launcher.run.eval_jobs import jobs_enabled, tasks_per_node
from launcher.run.slurm import executor_parameters, preflight, test_submission

# The submitting rank runs inside the training job's step: none of that job's SLURM, submitit or torch.distributed
# variables may leak into the evaluation job (its srun would read them).
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_", "TORCHELASTIC_")
INHERITED_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                             "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "SLURMTRAIN_LOG_FILE"})
KEPT = frozenset({"SLURM_CONF"})  # where the SLURM client finds its cluster


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


def render_script(cfg: DictConfig, run_dir: Path, step: int) -> str:
    """The evaluation job's sbatch script: the training job's settings (setup lines, environment, the preemption
    signal and --requeue) with the job's own resources, running the evaluation entry on every rank."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = eval_results.eval_dir(run_dir) / "slurm"
    command = " ".join([shlex.quote(sys.executable), "-u -m launcher.worker --evaluate",
                        shlex.quote(str(Path(run_dir).resolve())), str(step)])
    return _make_sbatch_string(command=command, folder=folder, **executor_parameters(job_config(cfg, step)))


def clean_environment(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items()
            if k in KEPT or not (k.startswith(INHERITED_PREFIXES) or k in INHERITED_NAMES)}


def submit_evaluation(cfg: DictConfig, run_dir: Path, step: int) -> str:
    """sbatch the evaluation of step N's checkpoint; its job id. Raises RuntimeError with sbatch's words."""
    script = eval_results.eval_dir(run_dir) / "slurm" / f"step_{step}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render_script(cfg, run_dir, step))
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=300,
                         env=clean_environment(dict(os.environ)))
    if out.returncode != 0:
        raise RuntimeError(f"sbatch refused the evaluation job of step {step}: {' '.join(out.stderr.split())}")
    job_id = out.stdout.strip().split(";")[0]
    eval_results.record_job(run_dir, step, job_id)
    return job_id


def check_eval_submission(cfg: DictConfig, plan: Plan) -> None:
    """At launch: SLURM's verdict (sbatch --test-only) on the evaluation jobs' resources, before training queues."""
    if not jobs_enabled(cfg) or cfg.launcher.dry_run:
        return
    preflight(cfg)
    test_submission(render_script(cfg, plan.run_dir, int(cfg.trainer.max_steps)))
