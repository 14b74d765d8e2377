"""RUN_DIR/eval/: what evaluation jobs (eval.async_jobs=true) leave in a run directory. Torch-free: the training
side writes the markers, the evaluation job the results, launcher.status reads them.

    eval/step_N.json      the result for the checkpoint of step N, one strict-JSON object written atomically
                          (a temporary file renamed), so a reader never sees half of one:
                              {"step": 40, "time": 1767000000.0, "job": "123", "world_size": 2,
                               "checkpoint": "/runs/r/checkpoints/step_40",
                               "val/val/loss": 4.1, "val/val/ppl": 60.3}
                          `val/NAME/loss` and `val/NAME/ppl` per set and `harness/TASK/METRIC` (and its
                          `harness/TASK/METRIC_stderr`) per harness task, the keys and values of a validation row of
                          metrics.jsonl (a value that is not finite is the string "nan", "inf" or "-inf", as there);
                          `time` is when it was written, `job` the SLURM job, `world_size` the ranks that evaluated.
    eval/step_N.pending   the checkpoint of step N awaits its evaluation: written by training's rank 0 before the
                          job is submitted, removed by the job once step_N.json is written. Retention keeps a
                          checkpoint while its marker exists (a failed or cancelled evaluation leaves it: remove the
                          marker to let retention delete the checkpoint).
    eval/jobs.txt         one line per submitted evaluation job: `STEP JOBID`.
    eval/requests/step_N.yaml  the config a `python -m launcher.evaluate` of step N ran with (the run's, with its
                          eval.* overrides and cluster), which its process or job reads instead of the checkpoint's.
    eval/slurm/           the evaluation jobs' scripts and logs (JOBID_RANK_log.err).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from contract.rundir.metrics_file import dumps, from_json_value

DIR_NAME = "eval"
MEASURED = ("val/", "harness/")  # a result's keys that are measurements (the rest says where they come from)


def eval_dir(run_dir: Path) -> Path:
    return Path(run_dir) / DIR_NAME


def result_path(run_dir: Path, step: int) -> Path:
    return eval_dir(run_dir) / f"step_{step}.json"


def request_path(run_dir: Path, step: int) -> Path:
    return eval_dir(run_dir) / "requests" / f"step_{step}.yaml"


def pending_path(run_dir: Path, step: int) -> Path:
    return eval_dir(run_dir) / f"step_{step}.pending"


def mark_pending(run_dir: Path, step: int) -> bool:
    """Mark step N's checkpoint as awaiting its evaluation; False when it already has a result or a marker (a
    checkpoint written again at the same step after a resume is evaluated once)."""
    if result_path(run_dir, step).exists():
        return False
    eval_dir(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        with pending_path(run_dir, step).open("x") as f:
            f.write(f"{time.time()}\n")
    except FileExistsError:
        return False
    return True


def clear_pending(run_dir: Path, step: int) -> None:
    pending_path(run_dir, step).unlink(missing_ok=True)


def awaiting_evaluation(run_dir: Path, step: int) -> bool:
    """Retention's question: may the checkpoint of this step not be deleted yet?"""
    return pending_path(run_dir, step).exists()


def record_job(run_dir: Path, step: int, job_id: str) -> None:
    with (eval_dir(run_dir) / "jobs.txt").open("a") as f:
        f.write(f"{step} {job_id}\n")


def write_result(run_dir: Path, step: int, values: dict[str, float], **info: Any) -> Path:
    """step_N.json, atomically; `info` adds fields (job, world_size, checkpoint). A result already there keeps
    the values this one does not measure again (another set or task, from launcher.evaluate)."""
    path = result_path(run_dir, step)
    before = next((row for row in read_results(run_dir) if row["step"] == step), {})
    values = {**{k: v for k, v in before.items() if k.startswith(MEASURED)}, **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(dumps({"step": step, "time": time.time(), **info, **values}) + "\n")
    os.replace(tmp, path)
    return path


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every result of the run, oldest step first; a file that does not parse is skipped."""
    rows = []
    for path in eval_dir(run_dir).glob("step_*.json"):
        try:
            row = from_json_value(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return sorted(rows, key=lambda r: r["step"])


def latest_result(run_dir: Path) -> dict[str, Any] | None:
    rows = read_results(run_dir)
    return rows[-1] if rows else None


def losses(row: dict[str, Any]) -> dict[str, float]:
    """A result's per-set losses: {NAME: loss}."""
    return {k.split("/")[1]: v for k, v in row.items() if k.startswith("val/") and k.endswith("/loss")}


def pending_steps(run_dir: Path) -> list[int]:
    steps = [p.name.removeprefix("step_").removesuffix(".pending") for p in eval_dir(run_dir).glob("step_*.pending")]
    return sorted(int(s) for s in steps if s.isdigit())


def summary(run_dir: Path) -> dict[str, Any] | None:
    """launcher.status's field: {"step", "losses": {NAME: loss}, "job", "pending": [steps]}; None without any."""
    latest, pending = latest_result(run_dir), pending_steps(run_dir)
    if latest is None and not pending:
        return None
    return {"step": latest["step"] if latest else None, "losses": losses(latest) if latest else {},
            "job": latest.get("job") if latest else None, "pending": pending}


def describe(summary: dict[str, Any]) -> str:
    """`evaluation jobs: step 40 val 4.1000 code 2.9000 (job 123); awaiting 50, 60` for launcher.status."""
    parts = []
    if summary.get("step") is not None:
        sets = " ".join(f"{name} {float(loss):.4f}" for name, loss in summary["losses"].items())
        parts.append(f"step {summary['step']} {sets}" + (f" (job {summary['job']})" if summary.get("job") else ""))
    if summary.get("pending"):
        parts.append("awaiting " + ", ".join(map(str, summary["pending"])))
    return "evaluation jobs: " + "; ".join(parts)
