"""One run, validated and planned, sent where it runs: this machine, SLURM, or (inside sbatch) only prepared."""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig


def dispatch(cfg: DictConfig, argv: list[str] | None = None) -> int:
    """Run one composed config. `argv` is the command that reproduces it (a sweep point's own overrides)."""
    from launcher.checks import resume_checks
    from launcher.plan import launch_plan as planning
    from launcher.run import rundir

    plan = planning.make_plan(cfg)
    if plan.mode == "prepare" and int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
        # A requeued sbatch script runs this again: resume what the first attempt saved, whatever it was told.
        cfg.run.resume, cfg.run.overwrite = True, False
    resume_checks.check_run_dir(cfg, plan.run_dir, plan.world_size)
    if plan.mode != "prepare":
        from launcher.run.slurm import refuse_live_jobs

        refuse_live_jobs(plan.run_dir)
    print(plan.summary(), file=sys.stderr)
    done = resume_checks.finished_step(cfg, plan.run_dir)
    if done is not None and plan.mode != "prepare" and not plan.refusal:
        # Nothing to train: start no rank, submit nothing and leave the run directory as it is.
        from launcher.plan.run_length import length_key, length_text

        print(f"nothing to do: {plan.run_dir} is already at step {done} of {length_text(cfg)} (raise "
              f"{length_key(cfg)} to train on)", file=sys.stderr)
        return 0
    if plan.refusal:
        from contract.errors import EXIT_BAD_INPUT

        print(f"error: {plan.refusal}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if plan.mode == "slurm":
        from launcher.run.slurm import check_eval_submission, submit

        check_eval_submission(cfg, plan)
        if int(cfg.parallel.get("replica_groups", 1)) > 1:
            from launcher.run import replica_slurm

            return replica_slurm.submit(cfg, plan, argv=argv)
        return submit(cfg, plan, argv=argv)
    from launcher.run.local import run_local

    if plan.mode == "local" and cfg.launcher.dry_run:
        print("dry run: nothing run (the plan above is what this command would do)", file=sys.stderr)
        return 0
    config_path = rundir.prepare(cfg, plan.run_dir, argv=argv, plan=plan)
    if plan.mode == "prepare":
        print(config_path)
        return 0
    if int(cfg.parallel.get("replica_groups", 1)) > 1:
        from launcher.run.replica_groups import run_replica_groups

        return run_replica_groups(config_path, plan.world_size, cfg.parallel)
    return run_local(config_path, plan.world_size)
