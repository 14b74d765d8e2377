"""One row per run for `launcher.status`: its state, step, checkpoint, losses, attempt ends, goodput and hours.

Queue and accounting facts come from contract/rundir/accounting.py; everything else is read from the run
directory, so a local run shows its progress too.
"""

from __future__ import annotations

import math
import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contract.errors import ConfigError
from contract.rules import blowup
from contract.rules.keep_best import keep_best_ranking
from contract.rundir import (
    accounting,
    ckpt_layout,
    eval_results,
    events,
    harness_scores,
    hf_export,
    measured,
    metrics_file,
    validation_log,
)
from contract.rundir import environment as environment_errors
from contract.rundir.metrics_file import read_metrics
from contract.rundir.replicas import failure_lines as replica_failure_lines
from contract.rundir.replicas import restarting as replica_restarting
from launcher.observe import run_cost
from launcher.observe.runs import DAMAGED, RunRef, Target, load_config, merge_jobs, newest_tasks


@dataclass
class Row:
    name: str
    run_dir: str
    job: str
    state: str
    step: int | None
    max_steps: int | None
    checkpoint_step: int | None
    requeues: int | None
    hours_unit: str | None  # GPU-h, CPU-h, or None for a local run
    loss: float | None  # the last logged loss; nan or inf when it is not finite (--json: "nan", "inf", "-inf")
    tokens_per_s: float | None
    gpu_hours: float | None
    cpu_hours: float | None
    cost: float | None
    # How the attempts ended (RUN_DIR/events.jsonl: finished, preempted, crashed, hung, ...) and the goodput.
    events: dict[str, int] = field(default_factory=dict)
    goodput: float | None = None
    # The step since which every logged loss has been nan or inf (None while the last loss is finite).
    loss_nonfinite_since: int | None = None
    # RUN_DIR/config.yaml can't be read (state "damaged config"): why, and the way out (resume_checks.damaged_config).
    config_damage: str | None = None
    # The newest validation loss of each set, in-loop or from an evaluation job: {NAME: {"step": N, "loss": L}}.
    validation: dict[str, dict[str, float | int]] = field(default_factory=dict)
    # The last attempt died of its environment (a full disk, a vanished run directory, memory): its one line.
    ending: str | None = None
    # eval.async_jobs: the newest evaluated step, its losses by set and the job; the steps still awaiting theirs.
    evaluation: dict[str, Any] | None = None
    # eval.harness.tasks: the newest scored step and its scores, in-loop or from an evaluation (contract/rundir/
    # harness_scores.py): {"step": N, "scores": {"harness/TASK/METRIC": V, "harness/TASK/METRIC_stderr": E}}.
    harness: dict[str, Any] | None = None
    # Silent data corruption found by the replica check: one line each, naming the ranks and hosts.
    corruption: list[str] = field(default_factory=list)
    # A mixture of experts: its routing over the last log interval (experts_line), None for a dense model.
    experts: str | None = None
    # Rollbacks with the sample ranges they skip, and the steps not applied (train/stability): one line each.
    stability: list[str] = field(default_factory=list)
    # The step since which every logged loss has been far above the run's start (contract/rules/blowup.py: more than
    # stability.blowup_margin nats above its first logged loss, capped at ln(vocab)); None while the last is not.
    loss_blown_since: int | None = None
    # checkpoint.keep_best: {"metric", "direction", "step", "value"} of the checkpoint kept as the best (step and value
    # None while no checkpoint is measured); None without keep_best.
    best: dict[str, Any] | None = None
    # checkpoint.export_hf: the end of training's Hugging Face export (contract/rundir/hf_export.py's record:
    # {"step", "path", "ok", "detail"}); None when the run wrote none.
    hf_export: dict[str, Any] | None = None
    # A sweep's ranking (launcher/observe/ranking.py): 1 for the best point, None without a finite value; the value.
    rank: int | None = None
    rank_value: float | None = None
    # What the GPU-time from the first start to the end went to, in rank-seconds (contract/rundir/failure_cost.py:
    # {"parts": {...}, "total", "goodput", "failures", ...}), None before a timed attempt; and, after a failure,
    # one line per failure of a plain run and the breakdown's line.
    failure_cost: dict[str, Any] | None = None
    cost_notes: list[str] = field(default_factory=list)


CLEAN_STOPS = ("stopped", "preempted", "cancelled")


def local_state(latest: ckpt_layout.CheckpointDir | None, max_steps: int | None, has_metrics: bool,
                newest: tuple[str, int] | None = None, recorded: str | None = None) -> str:
    """A local run whose newest attempt ended in no failure events.ending_state() names (`recorded`: the end it
    recorded, None: none): finished when its checkpoints say so; stopped when it recorded a clean, checkpointed stop
    (a Ctrl-C's, or its ranks' after their launcher was killed); else, when it ran on this host, running while its
    rank 0 lives and died (killed without a word: a SIGKILL, the OOM killer) once it is gone."""
    if latest is not None and max_steps is not None and latest.step >= max_steps or recorded == "finished":
        return "finished"
    if recorded in CLEAN_STOPS:
        return "stopped"
    if newest is not None and newest[0] == socket.gethostname():
        return "running" if _alive(newest[1]) else "died"
    return "stopped" if latest is not None or has_metrics else "not started"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def group_state(tasks: list[str], sacct: dict[str, list[accounting.Attempt]] | None) -> str:
    """A replica-group run's state from its array's tasks (each a group): RUNNING while any group runs, else PENDING
    while any waits, else COMPLETED when every group did, else the first other end."""
    states = [slurm_state(t, None if sacct is None else sacct.get(t, [])) for t in tasks]
    states = [s for s in states if s != "unknown"] or ["unknown"]
    for wanted in ("RUNNING", "PENDING"):
        if wanted in states:
            return wanted
    return next((s for s in states if s != "COMPLETED"), "COMPLETED")


def slurm_state(newest_job: str, attempts: list[accounting.Attempt] | None) -> str:
    queued = accounting.queue_state(newest_job)
    if queued:
        return queued
    if attempts:
        return attempts[-1].state
    return "unknown"


def _number(value: Any) -> float | None:
    """A logged figure as a float, nan and inf included (they mean the run diverged, not that nothing was logged)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# sacct's states of a job that left the queue for good (a requeued one shows PENDING or REQUEUED).
SLURM_ENDED = ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def final_end(attempt_ends: list[dict[str, Any]], last_start: tuple[int, float] | None) -> dict[str, Any] | None:
    """A local run's last end when no attempt started after it (else the run went on: that end is behind it)."""
    end = events.last_end(attempt_ends)
    if end is None or last_start is None:
        return end
    number = end.get("attempt")
    went_on = last_start[0] > number if isinstance(number, int) else last_start[1] > float(end.get("time") or 0)
    return None if went_on else end


def settle_progress(row: Row, attempt_ends: list[dict[str, Any]], metrics: list[dict[str, Any]],
                    final: dict[str, Any] | None) -> None:
    """The step column: the step the run ended at (`final`, the end no attempt followed), never below the newest
    checkpoint; and the goodput, with the work an end discarded (after the newest checkpoint) left out."""
    reached = [s for s in (row.step, row.checkpoint_step, None if final is None else final.get("step"))
               if isinstance(s, int)]
    row.step = max(reached) if reached else None
    kept = events.kept_step(attempt_ends, metrics, row.checkpoint_step, final)
    row.goodput = events.goodput(attempt_ends, metrics, kept)


def loss_blown_since(metrics: list[dict[str, Any]], config: dict[str, Any]) -> int | None:
    """The first step of the logged losses far above the run's start that the rows end with (None: the last one is
    not), by the run's own stability.blowup_margin and vocabulary."""
    losses = [(row["step"], value) for row in metrics if (value := _number(row.get("loss"))) is not None]
    start = next((value for _, value in losses if math.isfinite(value)), None)
    vocab = (config.get("model") or {}).get("vocab_size")
    margin = (config.get("stability") or {}).get("blowup_margin", blowup.DEFAULT_MARGIN)
    return blowup.far_above_since(losses, blowup.reference(start, vocab), float(margin))


def kept_best(run_dir: Any, config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint checkpoint.keep_best keeps, as retention finds it (contract/rundir/measured.py)."""
    try:
        chosen = keep_best_ranking(config.get("checkpoint") or {})
    except ConfigError:
        return None  # a hand-edited config.yaml: the launch that reads it says what is wrong
    if chosen is None:
        return None
    best = measured.best_checkpoint(run_dir, chosen)
    return {"metric": chosen.metric, "direction": chosen.direction, "step": best.checkpoint.step if best else None,
            "value": best.value if best else None}


def describe_best(best: dict[str, Any]) -> str:
    """`best checkpoint: step 40, val/val/loss 2.3104 (checkpoint.keep_best, lower is better)` for launcher.status."""
    if best["step"] is None:
        return f"best checkpoint: none measured yet (checkpoint.keep_best={best['metric']})"
    return (f"best checkpoint: step {best['step']}, {best['metric']} {float(best['value']):.4f} "
            f"(checkpoint.keep_best, {best['direction']})")


def experts_line(metrics_row: dict[str, Any]) -> str | None:
    """A MoE run's routing at its last logged step (train/observe/moe_stats.py): the expert load's max/mean of each
    layer, dropped tokens, the auxiliary losses."""
    by_layer = metrics_row.get("moe_load_max_mean_by_layer")
    if not isinstance(by_layer, dict) or not by_layer:
        return None
    worst = max(by_layer, key=lambda k: by_layer[k])
    return (f"experts at step {metrics_row.get('step')}: load max/mean {by_layer[worst]:.2f} in layer {worst} (the "
            f"most uneven of {len(by_layer)} MoE layers), dropped {float(metrics_row.get('moe_dropped', 0.0)):.1%}, "
            f"load-balancing loss {float(metrics_row.get('moe_aux_loss', float('nan'))):.3f}, router z-loss "
            f"{float(metrics_row.get('moe_z_loss', float('nan'))):.3f}")


def run_row(run: RunRef, sacct: dict[str, list[accounting.Attempt]] | None,
            waits: dict[str, list[float]] | None = None) -> Row:
    config, damage = load_config(run.run_dir)
    max_steps = (config.get("trainer") or {}).get("max_steps")
    cluster = config.get("cluster") or {}
    metrics = read_metrics(run.run_dir)
    trained = metrics_file.training_rows(metrics)
    last, last_trained = (metrics[-1] if metrics else {}), (trained[-1] if trained else {})
    latest = ckpt_layout.latest_complete_checkpoint(run.run_dir)
    row = Row(
        name=run.name, run_dir=str(run.run_dir), job=run.jobs[-1] if run.jobs else "local", state="",
        step=last.get("step"), max_steps=max_steps, checkpoint_step=latest.step if latest else None, requeues=None,
        hours_unit=None,
        loss=_number(last_trained.get("loss")), tokens_per_s=_number(last_trained.get("tokens_per_s")),
        gpu_hours=None, cpu_hours=None, cost=None,
    )
    diverged = metrics_file.nonfinite_since(trained, "loss")
    row.loss_nonfinite_since = diverged["step"] if diverged else None
    attempt_ends = events.read_events(run.run_dir)
    row.events = events.counts(attempt_ends)
    row.evaluation = eval_results.summary(run.run_dir)
    row.corruption = events.corruption_notes(attempt_ends)
    row.experts = experts_line(last_trained)
    row.stability = events.stability_notes(attempt_ends) + replica_failure_lines(  # parallel.replica_groups' losses
        attempt_ends, int((config.get("parallel") or {}).get("replica_groups") or 1), int(last.get("step") or 0))
    row.loss_blown_since = loss_blown_since(metrics, config)
    if attempt_ends and attempt_ends[-1].get("kind") == "environment":
        row.ending = attempt_ends[-1].get("message")
    row.config_damage = damage
    row.validation = validation_log.last_losses(run.run_dir)
    row.harness = harness_scores.latest(run.run_dir)
    row.best = kept_best(run.run_dir, config)
    row.hf_export = hf_export.read_record(run.run_dir)
    row.failure_cost = run_cost.cost(run.run_dir, config, run.jobs, waits or {})
    row.cost_notes = run_cost.cost_notes(run.run_dir, config, row.failure_cost, run.jobs, waits or {})
    if not run.jobs:
        final = final_end(attempt_ends, events.last_local_attempt(run.run_dir))
        ended = events.ending_state(attempt_ends, final)
        if final is not None and replica_restarting(attempt_ends, socket.gethostname(), _alive):
            ended = "running"  # a lost replica group its live launcher is starting again
        row.state = DAMAGED if damage else ended or local_state(latest, max_steps, bool(metrics),
                                                               events.newest_local_process(run.run_dir),
                                                               None if final is None else str(final.get("kind")))
        settle_progress(row, attempt_ends, metrics, final)
        return row
    groups = int((config.get("parallel") or {}).get("replica_groups") or 1)
    tasks = newest_tasks(run.jobs) if groups > 1 else []
    if tasks:
        row.job = tasks[0].partition("_")[0]  # the array: its tasks are the groups
    queued = group_state(tasks, sacct) if tasks else slurm_state(
        run.jobs[-1], None if sacct is None else sacct.get(run.jobs[-1], []))
    final = events.last_end(attempt_ends) if queued in SLURM_ENDED else None
    row.state = DAMAGED if damage else events.ending_state(attempt_ends, final) or queued
    settle_progress(row, attempt_ends, metrics, final)
    if queued == "OUT_OF_MEMORY" and row.ending is None:  # a cgroup OOM kill: no rank could say so itself
        row.ending = environment_errors.slurm_oom_line(run.jobs[-1], run.run_dir)
    tries = None if sacct is None else [a for job in run.jobs for a in sacct.get(job, [])]
    gpus_per_node = cluster.get("gpus_per_node")
    uses_gpus = bool(gpus_per_node) if cluster else any(a.gpus for a in tries or [])
    row.hours_unit = "GPU-h" if uses_gpus else "CPU-h"
    if sacct is None or tries is None:
        return row
    row.requeues = sum(max(len(sacct.get(job, [])) - 1, 0) for job in run.jobs)
    if uses_gpus:
        # Accounting without gres/gpu in AccountingStorageTRES reports no GPUs: fall back to the allocation asked for.
        asked = (cluster.get("nodes") or 1) * (gpus_per_node or 0)
        row.gpu_hours = sum(a.elapsed_s / 3600 * (a.gpus or asked) for a in tries)
        price = cluster.get("price_per_gpu_hour")
        row.cost = row.gpu_hours * price if isinstance(price, int | float) else None
    else:
        row.cpu_hours = sum(a.elapsed_s / 3600 * a.cpus for a in tries)
    return row


def collect(target: Target) -> list[Row]:
    jobs = merge_jobs(*(run.jobs for run in target.runs))
    sacct = accounting.attempts(jobs)
    waits = accounting.queue_waits(jobs) if jobs else {}
    return [run_row(run, sacct, waits) for run in target.runs]


def _sum(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def total(rows: list[Row]) -> dict[str, Any]:
    return {
        "runs": len(rows),
        "states": dict(Counter(row.state for row in rows)),
        "requeues": _sum([row.requeues for row in rows]),
        "gpu_hours": _sum([row.gpu_hours for row in rows]),
        "cpu_hours": _sum([row.cpu_hours for row in rows]),
        "cost": _sum([row.cost for row in rows]),
    }
