"""The SLURM jobs of a preparation (PARTS/jobs.txt, written by slurm.py as it queues them) and a refusal while one
of them still runs: run.py claims an output directory only when none does, and status.py lists them."""

from __future__ import annotations

from contract.errors import ConfigError
from launcher.prepare.plan import Plan

JOBS = "jobs.txt"


def live_jobs(plan: Plan) -> list[str]:
    from launcher.run import slurm

    return slurm.live_jobs(plan.parts) if (plan.parts / JOBS).is_file() else []


def refuse_live_jobs(plan: Plan) -> None:
    """Two preparations of one directory would do the work twice."""
    live = live_jobs(plan)
    if live:
        raise ConfigError(
            f"SLURM job {live[0]} is still preparing {plan.out}: wait for it (squeue -j "
            f"{','.join(live)}) or cancel it (scancel {' '.join(live)})"
        )
