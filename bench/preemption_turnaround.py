"""Preemption turnaround on the local SLURM cluster: from the preemption signal to a complete checkpoint and the
requeue, the steps lost (target 0), and from the restart to the first resumed step, as ratios where there is a
baseline measured in the same run.

Each repetition submits a real job as a user would (`python -m launcher +cluster=local_slurm`, the `tiny` model
on 2 nodes x 1 rank, a step every ~50-100 ms, `trainer.log_every=1`, `trainer.ckpt_every=0`: the only save
before the end is the preemption's), waits until it has logged a few steps and sends the cluster's preemption
signal (`cluster.signal`, USR1) to every rank with `scancel --signal=USR1 --full`, as SLURM does before the time
limit. Once the job is back in the queue it is released at once with `scontrol update StartTime=now` (a requeued
job otherwise waits for a BeginTime SLURM sets ~120 s ahead), as an operator or tests/slurm do; the resumed
attempt then runs to the end. Every moment is a wall clock time (one host, one clock) that the product or SLURM
records:
  - the signal: this process, just before `scancel`; the step at the signal: the last metrics.jsonl row whose
    `time` (when the row was written) is not later;
  - the stop checkpoint complete: the `time` in its `checkpoints/step_N/COMPLETE` marker; the synchronous save
    itself: the watchdog's timing of that save (`watchdog.json`, the attempt's only checkpoint section);
  - the requeue: the `preempted` line of events.jsonl, written just before rank 0 runs `scontrol requeue`;
  - steps lost: the last step the first attempt completed (its metrics rows, read before the resume, and the
    event's step) less the step the resumed attempt starts from (rank 0's `resumed from ...: step N` line);
  - the restart: the resumed attempt's process start (the `started` of its events.jsonl line: train.entry.run,
    after srun, the interpreter and submitit have started); the first resumed step: the `time` of its row;
  - baseline for the restart: the first attempt's own start -> first step, a fresh start of the same job;
  - requeue -> restart, in three parts: the old attempt ending (requeue -> the job seen PENDING again: its ranks
    exit and SLURM ends the step), pending in the queue (-> seen leaving PENDING; squeue every 0.1 s, as sacct's
    Start has whole seconds only) and the launch (-> the process start above: srun, the interpreter, submitit).
    The pending time is SLURM's, not ours: the BeginTime hold (released here at once) and the scheduler's pass.
The figures are medians over the repetitions (3; 1 with --quick); steps lost is the largest.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.rundir import accounting, ckpt_layout
from contract.rundir.events import read_events
from contract.rundir.metrics_file import read_metrics
from launcher.observe.runs import read_config

REPEATS = 3
STEPS = 400  # tiny steps take tens of ms: enough that the signal (after 20 logged steps) lands mid-run
SIGNAL_AFTER = 20  # logged steps before the signal (past start-up, far enough from the end)
LOST_TARGET = 0
JOB = ["+cluster=local_slurm", "model=tiny", f"trainer.max_steps={STEPS}", "trainer.log_every=1",
       "trainer.ckpt_every=0", "logger.backend=none"]
RESUMED = re.compile(r"resumed from .*: step (\d+)")
QUEUE_NOTE = "SLURM's, not ours: its BeginTime hold on a requeued job (released at once here) and scheduler"


class BenchError(RuntimeError):
    pass


def _poll(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _release(job_id: str) -> float:
    """Start the requeued job now rather than at its BeginTime; SLURM may set that again until the requeue has
    settled, so repeat every 2 s while it stays pending. Returns when the job was seen leaving PENDING (squeue
    every 0.1 s: sacct's Start has whole seconds only)."""
    asked = 0.0

    def running() -> bool:
        nonlocal asked
        state = accounting.queue_state(job_id)
        if state != "PENDING":
            return True
        if time.monotonic() - asked >= 2.0:
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True,
                           timeout=60)
            asked = time.monotonic()
        return False

    _poll(running, 120, f"requeued job {job_id} to start")
    return time.time()


def _one(root: Path, name: str, submitted: list[str]) -> dict[str, Any]:
    """One job: submit, signal, release, wait for the end; the raw observations of both attempts."""
    out = subprocess.run([sys.executable, "-m", "launcher", *JOB, f"run.root={root}", f"run.name={name}"],
                         capture_output=True, text=True, cwd=root, timeout=300)
    match = re.search(r"submitted job (\d+)", out.stdout)
    if out.returncode or not match:
        raise BenchError(f"submission failed ({out.returncode}): {out.stderr[-1000:]}")
    job_id = match.group(1)
    submitted.append(job_id)
    run_dir = root / name

    def alive() -> None:
        if accounting.queue_state(job_id) == "":
            raise BenchError(f"job {job_id} left the queue early; see {run_dir / 'slurm'}")

    def logged(n: int) -> bool:
        alive()
        return len(read_metrics(run_dir)) >= n

    _poll(lambda: logged(SIGNAL_AFTER), 300, f"job {job_id} to log {SIGNAL_AFTER} steps")
    signal = str(read_config(run_dir)["cluster"]["signal"]).removeprefix("SIG")
    t_signal = time.time()
    subprocess.run(["scancel", f"--signal={signal}", "--full", job_id], check=True, timeout=60)
    _poll(lambda: accounting.queue_state(job_id) == "PENDING", 120, f"job {job_id} to be requeued")
    pending_seen = time.time()
    # The first attempt is over: read what it left before the resume trims metrics rows past its checkpoint.
    rows_before = read_metrics(run_dir)
    preempted = next((e for e in read_events(run_dir) if e.get("kind") == "preempted"), None)
    if preempted is None:
        raise BenchError(f"job {job_id} was requeued without a preempted event: {read_events(run_dir)}")
    marker = _json_file(ckpt_layout.step_dir(run_dir, int(preempted["step"])) / ckpt_layout.MARKER)
    watchdog = _json_file(run_dir / "watchdog.json")
    running_seen = _release(job_id)

    def ended() -> bool:
        if len(read_events(run_dir)) >= 2:
            return True
        if accounting.queue_state(job_id) == "" and len(read_events(run_dir)) < 2:
            raise BenchError(f"job {job_id} ended without recording its resumed attempt; see {run_dir / 'slurm'}")
        return False

    _poll(ended, 300, f"job {job_id}'s resumed attempt to end", interval=0.5)
    log = "".join(p.read_text(errors="replace") for p in sorted((run_dir / "slurm").glob(f"{job_id}_0_log.err")))
    resumed = RESUMED.search(log)
    if resumed is None:
        raise BenchError(f"job {job_id}: no 'resumed from' line in rank 0's log")
    return {"job": job_id, "t_signal": t_signal, "pending_seen": pending_seen, "running_seen": running_seen,
            "rows_before": rows_before, "rows": read_metrics(run_dir),
            "events": read_events(run_dir), "marker": marker, "watchdog": watchdog,
            "resumed_step": int(resumed.group(1))}


def _row_time(rows: list[dict[str, Any]], step: int) -> float:
    found = [r["time"] for r in rows if r["step"] == step and "time" in r]
    if not found:
        raise BenchError(f"no metrics row with a time for step {step}")
    return float(found[0])


def turnaround(obs: dict[str, Any]) -> dict[str, Any]:
    """The figures of one preempted and resumed job from its raw observations (see `_one`; times in epoch s)."""
    events = obs["events"]
    kinds = [e.get("kind") for e in events]
    if "preempted" not in kinds or kinds.index("preempted") + 1 >= len(events):
        raise BenchError(f"expected a preempted attempt followed by another: {kinds}")
    first = events[kinds.index("preempted")]
    second = events[kinds.index("preempted") + 1]
    stop_step, resumed_step = int(first["step"]), int(obs["resumed_step"])
    t_signal = float(obs["t_signal"])
    signal_step = max((r["step"] for r in obs["rows_before"] if r.get("time", float("inf")) <= t_signal), default=0)
    last_step = max([stop_step, *(r["step"] for r in obs["rows_before"])])
    if obs["marker"].get("step") != stop_step:
        raise BenchError(f"checkpoint marker {obs['marker']} is not the stop step {stop_step}'s")
    wd = obs["watchdog"]
    save_s = wd.get("longest_s", {}).get("checkpoint") if wd.get("observations", {}).get("checkpoint") == 1 else None
    restart = float(second["started"])
    first_resumed = _row_time(obs["rows"], resumed_step + 1)
    return {
        "job": obs["job"],
        "signal_step": signal_step,
        "stop_step": stop_step,
        "resumed_step": resumed_step,
        "steps_after_signal": stop_step - signal_step,
        # What the first attempt did that the second does again; the product settles the same count on resume.
        "steps_lost": max(last_step - resumed_step, int(first.get("steps_lost", 0))),
        "signal_to_checkpoint_s": float(obs["marker"]["time"]) - t_signal,
        "save_s": None if save_s is None else float(save_s),
        "signal_to_requeue_s": float(first["time"]) - t_signal,
        "requeue_to_restart_s": restart - float(first["time"]),
        # Its three parts: the old attempt ending (its ranks exiting, SLURM cleaning up), pending in the queue
        # (SLURM's hold and scheduler), the launch (srun, the interpreter, submitit loading the pickled call).
        "requeue_to_pending_s": float(obs["pending_seen"]) - float(first["time"]),
        "pending_s": float(obs["running_seen"]) - float(obs["pending_seen"]),
        "launch_s": restart - float(obs["running_seen"]),
        "restart_to_first_step_s": first_resumed - restart,
        "start_to_first_step_s": _row_time(obs["rows"], 1) - float(first["started"]),
    }


def run(quick: bool = False) -> dict[str, Any]:
    if shutil.which("sbatch") is None or subprocess.run(["scontrol", "ping"], capture_output=True).returncode:
        return {"skipped": "no local SLURM cluster (make slurm-up)", "target_met": True}
    submitted: list[str] = []
    reps: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_preempt_") as tmp:
            for i in range(1 if quick else REPEATS):
                reps.append(turnaround(_one(Path(tmp), f"pre{i}", submitted)))
    finally:
        if submitted:
            subprocess.run(["scancel", *submitted], capture_output=True, timeout=60)
    median = {key: _median([r[key] for r in reps]) for key in reps[0] if key != "job"}
    restart_ratio = statistics.median(r["restart_to_first_step_s"] / r["start_to_first_step_s"] for r in reps)
    saves = [r["signal_to_checkpoint_s"] / r["save_s"] for r in reps if r["save_s"]]
    steps_lost = max(r["steps_lost"] for r in reps)
    return {
        "repeats": len(reps),
        "quick": quick,
        "steps": STEPS,
        "repetitions": reps,
        "median": median,
        "checkpoint_vs_save": statistics.median(saves) if len(saves) == len(reps) else None,
        "restart_vs_fresh_start": restart_ratio,
        "steps_lost": steps_lost,
        "targets": {"steps_lost": LOST_TARGET},
        "target_met": steps_lost <= LOST_TARGET,
        "command": "python -m bench preemption_turnaround",
    }


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    m = r["median"]
    if r["checkpoint_vs_save"] is not None:
        ckpt = {"value": r["checkpoint_vs_save"],
                "baseline": f"the synchronous save itself ({m['save_s']:.2f} s, watchdog.json)"}
    else:
        ckpt = {"value": m["signal_to_checkpoint_s"], "baseline": "seconds (no save time recorded)"}
    return [
        {"figure": "signal -> stop checkpoint complete", **ckpt, "target": None, "met": None,
         "detail": f"{m['signal_to_checkpoint_s']:.2f} s; stopped {m['steps_after_signal']:g} step(s) after the "
                   "signal"},
        {"figure": "signal -> requeued (s)", "value": m["signal_to_requeue_s"],
         "baseline": "seconds, not a ratio (events.jsonl's preempted line)", "target": None, "met": None,
         "detail": f"{m['signal_to_requeue_s']:.2f} s"},
        {"figure": "steps lost to a preemption", "value": float(r["steps_lost"]), "baseline": "steps",
         "target": f"<= {LOST_TARGET}", "met": r["steps_lost"] <= LOST_TARGET,
         "detail": f"largest of {r['repeats']}"},
        {"figure": "restart -> first resumed step", "value": r["restart_vs_fresh_start"],
         "baseline": "a fresh start of the same job: start -> first step", "target": None, "met": None,
         "detail": f"{m['restart_to_first_step_s']:.2f} s vs {m['start_to_first_step_s']:.2f} s"},
        {"figure": "requeued -> restarted (s)", "value": m["requeue_to_restart_s"],
         "baseline": "seconds, not a ratio", "target": None, "met": None,
         "detail": f"old attempt ending {m['requeue_to_pending_s']:.1f} s (its ranks exit, SLURM ends the step), "
                   f"pending {m['pending_s']:.1f} s, launch {m['launch_s']:.1f} s (srun, interpreter, submitit)"},
        {"figure": "pending in the queue after the requeue (s)", "value": m["pending_s"],
         "baseline": f"seconds, not a ratio; {QUEUE_NOTE}", "target": None, "met": None,
         "detail": f"{m['pending_s']:.2f} s"},
    ]


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"preemption turnaround: skipped ({result['skipped']})"
    m = result["median"]
    ckpt = (f" = {result['checkpoint_vs_save']:.2f}x the {m['save_s']:.2f} s save"
            if result["checkpoint_vs_save"] is not None else "")
    return (f"preemption turnaround (median of {result['repeats']}): signal -> stop checkpoint complete "
            f"{m['signal_to_checkpoint_s']:.2f} s{ckpt}, stopped {m['steps_after_signal']:g} step(s) after the "
            f"signal; signal -> requeued {m['signal_to_requeue_s']:.2f} s; steps lost {result['steps_lost']} "
            f"(target {LOST_TARGET}); requeued -> restarted {m['requeue_to_restart_s']:.1f} s (old attempt ending "
            f"{m['requeue_to_pending_s']:.1f} s, pending in the queue {m['pending_s']:.1f} s: {QUEUE_NOTE}; launch "
            f"{m['launch_s']:.1f} s); restart -> first resumed step {m['restart_to_first_step_s']:.2f} s = "
            f"{result['restart_vs_fresh_start']:.2f}x a fresh start's {m['start_to_first_step_s']:.2f} s")
