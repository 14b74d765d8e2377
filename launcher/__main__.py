"""python -m launcher [overrides]: compose -> validate -> plan -> dispatch (local or SLURM)."""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from launcher.errors import EXIT_BAD_INPUT, ConfigError
from launcher.schema import register

_composed = False


def dispatch(cfg: DictConfig) -> int:
    from launcher import plan as planning
    from launcher import rundir

    plan = planning.make_plan(cfg)
    if plan.mode == "prepare" and int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
        # A requeued sbatch script runs this again: resume what the first attempt saved, whatever it was told.
        cfg.run.resume, cfg.run.overwrite = True, False
    rundir.check_run_dir(cfg, plan.run_dir, plan.world_size)
    if plan.mode != "prepare":
        from launcher.slurm import refuse_live_jobs

        refuse_live_jobs(plan.run_dir)
    print(plan.summary(), file=sys.stderr)
    if plan.mode == "slurm":
        from launcher.slurm import submit

        return submit(cfg, plan)
    from launcher.local import run_local

    config_path = rundir.prepare(cfg, plan.run_dir)
    if plan.mode == "prepare":
        print(config_path)
        return 0
    return run_local(config_path, plan.world_size)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> int:
    global _composed
    _composed = True
    try:
        code = dispatch(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if code:
        sys.exit(code)
    return 0


def main() -> None:
    register()
    try:
        _hydra_main()
    except SystemExit as exit_:
        # Hydra reports a bad override or unknown key itself and exits 1 before our function runs;
        # that is bad input too, so it gets our exit code.
        if exit_.code == 1 and not _composed:
            sys.exit(EXIT_BAD_INPUT)
        raise


if __name__ == "__main__":
    main()
