"""A run directory read into the lanes of contract/rundir/failure_cost.py: what its GPU- (or CPU-) time went to,
and one line per failure, for launcher.status and bench/failure_cost.py.

A plain run is one lane of all its ranks (plan.json's world_size); with parallel.replica_groups=N, group k's run
directory (RUN_DIR for group 0, RUN_DIR/replicas/group_k) is a lane of world_size / N ranks, and the steps a lost
group did not train (the replica_rejoined lines in RUN_DIR/events.jsonl) are not its trained steps. The queue
waits of a SLURM run's requeued attempts come from sacct (contract/rundir/accounting.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.rundir import accounting, ckpt_layout, events, replicas
from contract.rundir.failure_cost import WATCHDOG_FILE, Lane, attempt_lines, attempts_of, cost_line, run_cost
from contract.rundir.metrics_file import read_metrics


def _plan(run_dir: Path) -> dict[str, Any]:
    try:
        plan = json.loads((Path(run_dir) / "plan.json").read_text())
    except (OSError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


def world_size(run_dir: Path, config: dict[str, Any]) -> int:
    """The run's ranks: plan.json's world_size, else local.nproc, else 1."""
    size = _plan(run_dir).get("world_size")
    if not isinstance(size, int) or size < 1:
        size = (config.get("local") or {}).get("nproc") or 1
    return int(size)


def accelerator(run_dir: Path, config: dict[str, Any]) -> str:
    """What the ranks ran on, "GPU" or "CPU": plan.json's, else (a run directory older than the key) the cluster's
    gpus_per_node, else GPU."""
    said = _plan(run_dir).get("accelerator")
    if said in ("GPU", "CPU"):
        return str(said)
    cluster = config.get("cluster")
    return "CPU" if isinstance(cluster, dict) and not cluster.get("gpus_per_node") else "GPU"


def checkpoint_seconds(run_dir: Path) -> float | None:
    try:
        spent = json.loads((Path(run_dir) / WATCHDOG_FILE).read_text()).get("spent_s") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return float(spent.get("checkpoint", 0.0))


def lane(run_dir: Path, ranks: int, missed_steps: int = 0, replica_group: bool = False,
         queue_waits: list[float] | None = None, main_events: list[dict[str, Any]] | None = None) -> Lane:
    """One lane from its run directory. `missed_steps`: the steps trained without it (a replica group's);
    `queue_waits`: its job's attempts' waits in the queue, the first (before the run started) left out here."""
    ends = events.read_events(run_dir)
    starts = [(number, start) for number, start, _ in events._local_starts(run_dir)]  # local_attempts.txt's reader
    rows = [r for r in read_metrics(run_dir) if r.get("time") is not None and r.get("step") is not None]
    trained = [r for r in rows if "loss" in r or "step_time_s" in r]
    latest = ckpt_layout.latest_complete_checkpoint(run_dir)
    ledger = main_events if main_events is not None else ends
    final = events.last_end(ends)
    kept = events.kept_step(ends, trained, latest.step if latest else None, final)
    useful = kept - sum(1 for s in events.skipped_steps(ledger) if s <= kept) - missed_steps
    return Lane(ranks=ranks, attempts=attempts_of(ends, starts, trained), rows=trained,
                useful_steps=useful, checkpoint_s=checkpoint_seconds(run_dir), replica_group=replica_group,
                queue_waits=list((queue_waits or [])[1:]))


def lanes(run_dir: Path, config: dict[str, Any], jobs: list[str] | None = None,
          waits: dict[str, list[float]] | None = None) -> list[Lane]:
    groups = int((config.get("parallel") or {}).get("replica_groups") or 1)
    size = world_size(run_dir, config)
    job_waits = [w for job in jobs or [] for w in (waits or {}).get(job, [])]
    if groups <= 1:
        return [lane(run_dir, size, queue_waits=job_waits)]
    ledger = events.read_events(run_dir)
    missed = dict.fromkeys(range(groups), 0)
    for loss in replicas.failures(ledger):
        for g in loss.get("groups", []):
            missed[int(g)] = missed.get(int(g), 0) + int(loss.get("reduced_steps") or 0)
    # On SLURM group k is task k of a job array (`57_2`): its requeues wait in the queue alone.
    task_waits = {g: [w for job in jobs or [] if job.endswith(f"_{g}") for w in (waits or {}).get(job, [])]
                  for g in range(groups)}
    return [lane(replicas.group_dir(run_dir, g), max(1, size // groups), missed[g], True, task_waits[g],
                 main_events=ledger) for g in range(groups)]


def cost(run_dir: Path, config: dict[str, Any], jobs: list[str] | None = None,
         waits: dict[str, list[float]] | None = None) -> dict[str, Any] | None:
    """contract/rundir/failure_cost.py's breakdown of this run (None before a timed attempt); `waits`: sacct's
    queue waits by job (accounting.queue_waits), asked for here when a SLURM run's are not given."""
    if jobs and waits is None:
        waits = accounting.queue_waits(jobs)
    return run_cost(lanes(Path(run_dir), config, jobs, waits))


def cost_notes(run_dir: Path, config: dict[str, Any], breakdown: dict[str, Any] | None,
               jobs: list[str] | None = None, waits: dict[str, list[float]] | None = None) -> list[str]:
    """For launcher.status: a plain run's failures, one line each, then the breakdown's line; nothing for a run
    without a failure (its line would only restate the goodput): no restart, no time between attempts after one, no
    queue wait, nothing redone. Stalled steps alone (a straggler) are no failure."""
    failed = breakdown is not None and any(breakdown["parts"][k] > 0 for k in ("restart", "between", "queue",
                                                                                  "redone"))
    if breakdown is None or not failed:
        return []
    groups = int((config.get("parallel") or {}).get("replica_groups") or 1)
    notes = [] if groups > 1 else attempt_lines(lanes(Path(run_dir), config, jobs, waits)[0])
    return [*notes, cost_line(breakdown, accelerator(run_dir, config))]
