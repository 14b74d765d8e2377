"""Submitting an evaluation job (eval.async_jobs=true; the design: contract/rules/eval_jobs.py): the sbatch call
training's rank 0 makes once a checkpoint is complete, with its script (contract/rules/eval_job_script.py) and an
environment cleared of the training job's. Torch-free: it runs on the checkpoint I/O thread.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from omegaconf import DictConfig

from contract.rules.eval_job_script import render_script
from contract.rundir import eval_results

# The submitting rank runs inside the training job's step: none of that job's SLURM, submitit or torch.distributed
# variables may leak into the evaluation job (its srun would read them).
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_", "TORCHELASTIC_")
INHERITED_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                             "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "SLURMTRAIN_LOG_FILE",
                             "SLURMTRAIN_STORE_FD"})
KEPT = frozenset({"SLURM_CONF"})  # where the SLURM client finds its cluster


def clean_environment(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items()
            if k in KEPT or not (k.startswith(INHERITED_PREFIXES) or k in INHERITED_NAMES)}


def submit_evaluation(cfg: DictConfig, run_dir: Path, step: int, config: Path | None = None) -> str:
    """sbatch the evaluation of step N's checkpoint; its job id. Raises RuntimeError with sbatch's words.
    `config`: the job reads it instead of the checkpoint's (launcher.evaluate's overrides)."""
    script = eval_results.eval_dir(run_dir) / "slurm" / f"step_{step}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render_script(cfg, run_dir, step, config))
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=300,
                         env=clean_environment(dict(os.environ)))
    if out.returncode != 0:
        raise RuntimeError(f"sbatch refused the evaluation job of step {step}: {' '.join(out.stderr.split())}")
    job_id = out.stdout.strip().split(";")[0]
    eval_results.record_job(run_dir, step, job_id)
    return job_id


