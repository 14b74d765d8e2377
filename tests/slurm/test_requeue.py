"""The heart of the product on a real SLURM: USR1 mid-run -> checkpoint -> requeue -> exact resume."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import preempt_and_release, submitted_job_id

pytestmark = pytest.mark.slurm

STEPS = 150


def test_usr1_requeues_and_resumes_exactly(run_root: Path) -> None:
    common = [f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.ckpt_every=0",
              f"run.root={hq(run_root)}"]
    out = launch("+cluster=local_slurm", "run.name=pre", *common)
    assert out.returncode == 0, out.stderr
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "pre"
    assert preempt_and_release(job_id, run_dir) == "COMPLETED"

    history = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-o", "State"], capture_output=True,
                             text=True).stdout.split()
    assert "REQUEUED" in history and history[-1] == "COMPLETED", history
    log = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob(f"{job_id}_0_log.err")))
    resumed = re.search(r"resumed from .*step_(\d+): step (\d+)", log)
    assert resumed, log[-3000:]
    stop_step = int(resumed.group(2))
    assert 5 <= stop_step < STEPS
    assert f"requeueing job {job_id}" in log

    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step exactly once

    reference = launch("local.nproc=2", "run.name=ref", *common)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(run_root / "ref")]

    # One wandb run, continued: both attempts logged offline under the same run id.
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2, attempts
    assert len({p.name.rsplit("-", 1)[-1] for p in attempts}) == 1


def test_plain_sbatch_script_requeues_on_usr1(run_root: Path) -> None:
    import sys

    from tests.conftest import ROOT, launcher_env

    out = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1",
         "--time=10", f"--output={run_root}/sbatch-%j.out", str(ROOT / "sbatch" / "multi_node.sbatch"),
         f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.ckpt_every=0", "logger.backend=none",
         f"run.root={hq(run_root)}", "run.name=plainpre", "run.resume=false"],
        capture_output=True, text=True, env=launcher_env(SLURMTRAIN_PYTHON=sys.executable), cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    run_dir = run_root / "plainpre"
    state = preempt_and_release(job_id, run_dir)
    assert state == "COMPLETED", (run_root / f"sbatch-{job_id}.out").read_text()[-3000:]
    # The requeued script resumed (run.resume=false was a launch-time choice) and logged every step once.
    assert "resumed from" in (run_root / f"sbatch-{job_id}.out").read_text()
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, STEPS + 1))


def test_second_submission_on_a_live_run_directory_is_refused(run_root: Path) -> None:
    common = [f"trainer.max_steps={STEPS * 10}", "logger.backend=none", f"run.root={hq(run_root)}", "run.name=twice"]
    first = launch("+cluster=local_slurm", *common)
    assert first.returncode == 0, first.stderr
    job_id = submitted_job_id(first.stdout)
    try:
        second = launch("+cluster=local_slurm", *common)
        assert second.returncode == 2
        assert f"job {job_id} is still queued or running" in second.stderr
        local = launch("local.nproc=1", *common)
        assert local.returncode == 2
    finally:
        subprocess.run(["scancel", job_id], check=True)
    assert (run_root / "twice" / "jobs.txt").read_text().split() == [job_id]
