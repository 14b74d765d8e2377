"""Evaluation jobs on the real local cluster (eval.async_jobs=true, issue 21 acceptance 2): one job per checkpoint,
all COMPLETED, their losses equal in-loop validation of the same steps, a USR1 requeues one and it completes, and
retention (checkpoint.keep_last=1) deletes no checkpoint before its evaluation. One shared training run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import eval_results
from tests.conftest import hq, launch, launcher_env, read_metrics
from tests.slurm.helpers import (
    poll,
    release_requeued,
    sacct_state,
    squeue_state,
    submitted_job_id,
    wait_terminal,
)
from train.evaluation.job import TEST_HOLD_ENV

pytestmark = pytest.mark.slurm

STEPS, EVERY, HELD = 8, 2, 4
COMMON = [f"trainer.max_steps={STEPS}", f"trainer.ckpt_every={EVERY}", "checkpoint.keep_last=1", "trainer.log_every=1",
          "logger.backend=none"]


def eval_jobs(run_dir: Path) -> dict[int, str]:
    path = eval_results.eval_dir(run_dir) / "jobs.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    return {int(step): job for step, job in (line.split() for line in lines)}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("eval") / "runs with space's"
    out = launch("+cluster=local_slurm", "eval.async_jobs=true", *COMMON, f"run.root={hq(root)}", "run.name=ev",
                 **{TEST_HOLD_ENV: str(HELD)})
    assert out.returncode == 0, out.stderr
    train_job, run_dir = submitted_job_id(out.stdout), root / "ev"
    jobs: list[str] = []
    try:
        assert wait_terminal(train_job, timeout=240) == "COMPLETED"
        # The evaluation of step HELD holds after loading its checkpoint, until a signal comes.
        poll(lambda: (eval_results.eval_dir(run_dir) / f"step_{HELD}.held").is_file(), 180, "the held evaluation job")
        jobs = list(eval_jobs(run_dir).values())
        held = eval_jobs(run_dir)[HELD]
        subprocess.run(["scancel", "--signal=USR1", "--full", held], check=True)
        release_requeued(held)  # in a later second than its requeue (tests/slurm/helpers.py)
        states = {step: wait_terminal(job, timeout=240) for step, job in eval_jobs(run_dir).items()}
    finally:
        for job in jobs:  # anything still queued after a failure: cancelled, ours only
            if squeue_state(job):
                subprocess.run(["scancel", job], check=False)
    return {"root": root, "run_dir": run_dir, "train_job": train_job, "states": states, "held": held}


def test_one_evaluation_job_per_checkpoint_and_all_complete(evaluated: dict[str, Any]) -> None:
    jobs = eval_jobs(evaluated["run_dir"])
    assert sorted(jobs) == list(range(EVERY, STEPS + 1, EVERY))
    assert len(set(jobs.values())) == len(jobs)
    assert evaluated["states"] == dict.fromkeys(jobs, "COMPLETED")
    assert [r["step"] for r in eval_results.read_results(evaluated["run_dir"])] == sorted(jobs)


def test_losses_equal_in_loop_validation_of_the_same_steps(evaluated: dict[str, Any]) -> None:
    reference = launch("local.nproc=2", f"eval.every={EVERY}", *COMMON, f"run.root={hq(evaluated['root'])}",
                       "run.name=inloop")
    assert reference.returncode == 0, reference.stderr[-3000:]
    in_loop = {r["step"]: r for r in read_metrics(evaluated["root"] / "inloop") if "val/val/loss" in r}
    results = eval_results.read_results(evaluated["run_dir"])
    assert sorted(in_loop) == [r["step"] for r in results]
    for row in results:
        assert row["world_size"] == 1  # the job's own size: the training and in-loop runs had 2 ranks
        keys = [k for k in row if k.startswith("val/")]
        assert keys and set(keys) == {k for k in in_loop[row["step"]] if k.startswith("val/")}
        for key in keys:
            assert math.isclose(row[key], in_loop[row["step"]][key], rel_tol=1e-5), (row["step"], key)
    # Training itself is the same run: equal training losses.
    assert [r["loss"] for r in read_metrics(evaluated["run_dir"])] == [r["loss"] for r in read_metrics(
        evaluated["root"] / "inloop")]


def test_a_usr1_requeues_the_evaluation_job_and_it_completes(evaluated: dict[str, Any]) -> None:
    held = evaluated["held"]
    history = subprocess.run(["sacct", "-j", held, "-D", "-X", "-n", "-o", "State"], capture_output=True,
                             text=True).stdout.split()
    assert "REQUEUED" in history and history[-1] == "COMPLETED", history
    assert sacct_state(held) == "COMPLETED"
    log = (eval_results.eval_dir(evaluated["run_dir"]) / "slurm" / f"{held}_0_log.err").read_text()
    assert f"requeueing job {held}" in log, log[-3000:]
    assert eval_results.result_path(evaluated["run_dir"], HELD).is_file()


def test_no_checkpoint_is_deleted_before_its_evaluation(evaluated: dict[str, Any]) -> None:
    run_dir = evaluated["run_dir"]
    # The requeued job read step HELD's checkpoint after training had finished: keep_last=1 kept it for it until then.
    finished = max(r["time"] for r in read_metrics(run_dir))
    held = json.loads(eval_results.result_path(run_dir, HELD).read_text())
    assert held["time"] > finished and held["checkpoint"].endswith(f"step_{HELD}")
    # Each evaluation done, retention caught up: the last checkpoint alone, no evaluation awaited.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{STEPS}"]
    assert eval_results.pending_steps(run_dir) == []


def test_status_shows_the_newest_evaluated_step_and_its_losses(evaluated: dict[str, Any]) -> None:
    out = subprocess.run([sys.executable, "-m", "launcher.status", str(evaluated["run_dir"]), "--json"],
                         capture_output=True, text=True, env=launcher_env())
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)["rows"][0]["evaluation"]
    last = eval_results.latest_result(evaluated["run_dir"])
    assert last is not None and shown["step"] == STEPS
    assert shown["losses"] == eval_results.losses(last) and shown["pending"] == []
    text = subprocess.run([sys.executable, "-m", "launcher.status", str(evaluated["run_dir"])], capture_output=True,
                          text=True, env=launcher_env()).stdout
    assert f"evaluation jobs: step {STEPS} val {last['val/val/loss']:.4f}" in text
