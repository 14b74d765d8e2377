"""Evaluation as SLURM jobs of their own (eval.async_jobs=true; lingua's async_eval_gpus, nanotron's per-checkpoint
evaluation jobs): which steps get one and the launch-time checks. Torch-free.

Who does what:
    launch     check_eval_jobs (make_plan) refuses what can't work; eval_submit.check_eval_submission asks SLURM
               (sbatch --test-only) about the job's resources before the training job is queued.
    training   rank 0, once a checkpoint of an evaluated step is complete (its COMPLETE marker written:
               train/checkpoints/manager.py), marks it pending (retention keeps it) and submits the job from a background
               thread (submit_evaluation): training never waits for it.
    the job    `python -m launcher.worker --evaluate RUN_DIR STEP` on every rank (train/evaluation/job.py) loads
               that checkpoint on the job's ranks, runs the in-loop Validator over the same sets and writes
               RUN_DIR/eval/step_N.json, then removes the pending marker (files: contract/rundir/eval_results.py).
The job's script and its submission: train/evaluation/submit.py.

Evaluated steps: every multiple of trainer.ckpt_every and trainer.max_steps (as in-loop validation evaluates every
eval.every steps and at the end); a checkpoint written on preemption at another step is not evaluated. With
eval.async_jobs the loop itself evaluates only at step 0 with eval.at_start (there is no checkpoint to hand over).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError


def jobs_enabled(cfg: Any) -> bool:
    section = cfg.get("eval") if hasattr(cfg, "get") else getattr(cfg, "eval", None)
    return section is not None and bool(section.get("async_jobs", False))


def evaluated_step(cfg: Any, step: int) -> bool:
    every, last = int(cfg.trainer.ckpt_every), int(cfg.trainer.max_steps)
    return step > 0 and ((every > 0 and step % every == 0) or step == last)


def tasks_per_node(cfg: Any, cluster_tasks: int) -> int:
    """The evaluation job's ranks per node; `cluster_tasks`: the training job's (launcher.plan.world.tasks_per_node)."""
    return int(cfg.eval.job_tasks_per_node or cluster_tasks)


def check_eval_jobs(cfg: DictConfig, global_batch: int, cluster_tasks: int) -> None:
    """Launch-time refusals, one line each (the sets themselves: contract/rules/eval_sets.py check_eval).
    `cluster_tasks`: the training job's ranks per node."""
    if not jobs_enabled(cfg):
        return
    e = cfg.eval
    if cfg.cluster is None:
        raise ConfigError("eval.async_jobs=true submits an evaluation job per checkpoint and needs a SLURM cluster: "
                          "add +cluster=NAME, or evaluate in the loop with eval.every=N instead")
    if int(e.every) > 0:
        raise ConfigError(f"eval.every={e.every} with eval.async_jobs=true: the jobs evaluate each checkpoint "
                          f"(trainer.ckpt_every={cfg.trainer.ckpt_every}) instead of the loop; drop eval.every, or "
                          f"set trainer.ckpt_every={e.every} to evaluate every {e.every} steps")
    check_job_world(cfg, global_batch, cluster_tasks)


def check_job_world(cfg: DictConfig, global_batch: int, cluster_tasks: int) -> None:
    """The evaluation job's ranks can hold the model's layout and split the global batch (launcher.evaluate's jobs
    too)."""
    e = cfg.eval
    world = int(e.job_nodes) * tasks_per_node(cfg, cluster_tasks)
    model_parallel = int(cfg.parallel.tp) * int(cfg.parallel.pp)
    if world % model_parallel:
        raise ConfigError(f"the evaluation job's {world} ranks (eval.job_nodes x eval.job_tasks_per_node) are "
                          f"not a multiple of parallel.tp x parallel.pp = {model_parallel}: set "
                          f"eval.job_tasks_per_node to a multiple of {model_parallel}")
    per_step = int(cfg.trainer.micro_batch_size) * (world // model_parallel)
    if global_batch % per_step:
        raise ConfigError(f"the evaluation job's {world // model_parallel} data-parallel ranks x "
                          f"trainer.micro_batch_size={cfg.trainer.micro_batch_size} do not divide the global batch "
                          f"{global_batch} that eval.batches counts in: pick eval.job_nodes x "
                          "eval.job_tasks_per_node so that they do")
