"""Harness tasks in evaluation jobs on the real local cluster (issue 30, acceptance 2 and 3): with
eval.async_jobs=true and eval.harness.tasks, every kept checkpoint's job writes its scores; retention
(checkpoint.keep_last=1) waits for them; a USR1 to a job that has loaded its checkpoint (before its pass: the pass
itself is let finish) requeues it and its result is written once; status shows the scores; launcher.evaluate
--step N here and with +cluster=local_slurm writes the job's numbers. One shared training run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import eval_results
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.harness_task import TASK, write_pattern_data, write_pattern_task
from tests.slurm.helpers import poll, release_requeued, squeue_state, submitted_job_id, wait_terminal
from train.evaluation.job import TEST_HOLD_ENV

pytestmark = pytest.mark.slurm

STEPS, EVERY, HELD = 60, 30, 30
ACC = f"harness/{TASK}/acc"


def eval_jobs(run_dir: Path) -> dict[int, str]:
    path = eval_results.eval_dir(run_dir) / "jobs.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    return {int(step): job for step, job in (line.split() for line in lines)}


def measured(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith(("val/", "harness/"))}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("harness_jobs") / "dir with space's"
    data, tasks = write_pattern_data(base / "data"), write_pattern_task(base / "tasks")
    out = launch("+cluster=local_slurm", "eval.async_jobs=true", "data=tokens", f"data.path={hq(data)}",
                 "model.vocab_size=257", f"trainer.max_steps={STEPS}", f"trainer.ckpt_every={EVERY}",
                 "checkpoint.keep_last=1", "logger.backend=none", f"eval.harness.tasks=[{TASK}]",
                 f"eval.harness.include_path={hq(tasks)}", f"run.root={hq(base / 'runs')}", "run.name=ev",
                 **{TEST_HOLD_ENV: str(HELD)})
    assert out.returncode == 0, out.stderr
    train_job, run_dir = submitted_job_id(out.stdout), base / "runs" / "ev"
    jobs: list[str] = []
    try:
        assert wait_terminal(train_job, timeout=300) == "COMPLETED"
        poll(lambda: (eval_results.eval_dir(run_dir) / f"step_{HELD}.held").is_file(), 240, "the held evaluation job")
        held = eval_jobs(run_dir)[HELD]
        jobs = list(eval_jobs(run_dir).values())
        subprocess.run(["scancel", "--signal=USR1", "--full", held], check=True)
        release_requeued(held)  # in a later second than its requeue (tests/slurm/helpers.py)
        states = {step: wait_terminal(job, timeout=300) for step, job in eval_jobs(run_dir).items()}
    finally:
        for job in jobs:
            if squeue_state(job):
                subprocess.run(["scancel", job], check=False)
    return {"base": base, "run_dir": run_dir, "states": states, "held": held, "tasks": tasks}


def test_every_kept_checkpoints_job_writes_its_scores(evaluated: dict[str, Any]) -> None:
    run_dir = evaluated["run_dir"]
    assert evaluated["states"] == {EVERY: "COMPLETED", STEPS: "COMPLETED"}
    results = {r["step"]: r for r in eval_results.read_results(run_dir)}
    assert sorted(results) == [EVERY, STEPS]
    assert all(ACC in r and f"{ACC}_stderr" in r and "val/val/loss" in r for r in results.values())
    assert results[STEPS][ACC] > 0.9
    # Retention waited for each evaluation: the held one read its checkpoint after training had finished.
    held = results[HELD]
    assert held["time"] > max(r["time"] for r in read_metrics(run_dir)) and held["checkpoint"].endswith(f"step_{HELD}")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{STEPS}"]
    assert eval_results.pending_steps(run_dir) == []


def test_a_usr1_requeues_the_job_and_its_result_is_written_once(evaluated: dict[str, Any]) -> None:
    held = evaluated["held"]
    log = (eval_results.eval_dir(evaluated["run_dir"]) / "slurm" / f"{held}_0_log.err").read_text()
    assert f"requeueing job {held}" in log, log[-3000:]
    assert log.count(f"evaluation of step {HELD} written to") == 1, log[-3000:]


def test_status_shows_the_scores(evaluated: dict[str, Any]) -> None:
    out = subprocess.run([sys.executable, "-m", "launcher.status", str(evaluated["run_dir"])], cwd=ROOT,
                         capture_output=True, text=True, env=launcher_env())
    assert out.returncode == 0, out.stderr
    last = eval_results.latest_result(evaluated["run_dir"])
    assert last is not None
    assert f"ev: harness @{STEPS}: {TASK}/acc {last[ACC]:.4f}" in out.stdout, out.stdout


def test_launcher_evaluate_here_and_on_the_cluster_writes_the_jobs_numbers(evaluated: dict[str, Any]) -> None:
    run_dir = evaluated["run_dir"]
    job = measured(json.loads(eval_results.result_path(run_dir, STEPS).read_text()))

    def evaluate(*extra: str) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-m", "launcher.evaluate", str(run_dir), "--step", str(STEPS), *extra],
                             cwd=ROOT, capture_output=True, text=True, env=launcher_env(), timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        if extra:
            submitted = out.stdout.split("submitted job ")[1].split(";")[0]
            assert wait_terminal(submitted, timeout=300) == "COMPLETED"
        return measured(json.loads(eval_results.result_path(run_dir, STEPS).read_text()))

    for values in (evaluate(), evaluate("+cluster=local_slurm")):
        assert values.keys() == job.keys()
        for key, value in job.items():
            assert values[key] == pytest.approx(value, rel=1e-6), key
