"""checkpoint.keep_best with evaluation jobs on the real local cluster (issue 30, item 5): the measurements arrive after
the checkpoints, from jobs of their own, and training with checkpoint.keep_last=1 never waits for them; once every
job has written its result the checkpoint that measured best is still there beside the newest, and the others are
gone. The learning rate climbs through a 40-step warmup to a peak far too high (tests/dist/test_keep_best.py's run,
in the loop), so the validation loss turns up after a point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.rundir import ckpt_layout as layout
from contract.rundir import eval_results
from tests.conftest import ROOT, hq, launch, launcher_env
from tests.slurm.helpers import poll, submitted_job_id, wait_terminal

pytestmark = pytest.mark.slurm


def test_the_best_checkpoint_survives_when_its_measurement_comes_later(tmp_path: Path) -> None:
    root = tmp_path / "runs with space's"
    out = launch("+cluster=local_slurm", "eval.async_jobs=true", "trainer.max_steps=40", "trainer.ckpt_every=10",
                 "trainer.log_every=10", "checkpoint.keep_last=1", "checkpoint.keep_best=val/val/loss",
                 "optim.schedule=constant", "optim.warmup_steps=40", "optim.lr=1.0", "logger.backend=none",
                 f"run.root={hq(root)}", "run.name=jobs")
    assert out.returncode == 0, out.stderr
    run_dir = root / "jobs"
    jobs_file = eval_results.eval_dir(run_dir) / "jobs.txt"
    try:
        assert wait_terminal(submitted_job_id(out.stdout), timeout=300) == "COMPLETED"
        poll(lambda: jobs_file.is_file() and len(jobs_file.read_text().split()) == 8, 120, "four evaluation jobs")
        jobs = dict(line.split() for line in jobs_file.read_text().splitlines())
        assert {step: wait_terminal(job, timeout=300) for step, job in jobs.items()} == dict.fromkeys(
            ["10", "20", "30", "40"], "COMPLETED")
    finally:
        for job in (dict(line.split() for line in jobs_file.read_text().splitlines()).values()
                    if jobs_file.is_file() else []):
            subprocess.run(["scancel", job], check=False)
    losses = {row["step"]: row["val/val/loss"] for row in eval_results.read_results(run_dir)}
    assert sorted(losses) == [10, 20, 30, 40] and not eval_results.pending_steps(run_dir)
    best = min(losses, key=lambda step: losses[step])
    assert best < 40 and losses[40] > losses[best], losses
    # The last job to finish applies retention: whatever order the results came in, the best one stays.
    poll(lambda: [c.step for c in layout.list_checkpoints(run_dir)] == [best, 40], 60,
         f"retention to leave steps {best} and 40")
    status = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"], capture_output=True,
                            text=True, env=launcher_env(), cwd=ROOT, timeout=120)
    [row] = json.loads(status.stdout)["rows"]
    assert (row["best"]["step"], row["best"]["value"]) == (best, losses[best])
