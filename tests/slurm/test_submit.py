"""Submission through submitit to the real local cluster (make slurm-up): nodes n1 and n2, gloo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.slurm.helpers import (
    assert_on_two_nodes,
    poll,
    queued_jobs_named,
    sacct_state,
    submitted_job_id,
    wait_terminal,
)

pytestmark = pytest.mark.slurm


def test_job_spans_both_nodes_and_matches_local_losses(run_root: Path) -> None:
    common = ["trainer.max_steps=20", "trainer.log_every=1", "logger.backend=none", f"run.root={hq(run_root)}"]
    out = launch("+cluster=local_slurm", "launcher.wait=true", "run.name=s", *common)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    job_id = submitted_job_id(out.stdout)
    assert sacct_state(job_id) == "COMPLETED"
    assert_on_two_nodes(out.stdout)
    local = launch("local.nproc=2", "run.name=l", *common)
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm, on_local = read_metrics(run_root / "s"), read_metrics(run_root / "l")
    assert [r["step"] for r in on_slurm] == list(range(1, 21))
    assert [r["loss"] for r in on_slurm] == [r["loss"] for r in on_local]
    run_dir = run_root / "s"
    assert "#SBATCH --requeue" in (run_dir / "sbatch.sh").read_text()
    assert (run_dir / "jobs.txt").read_text().split() == [job_id]


def test_unknown_partition_is_refused_and_nothing_is_queued(run_root: Path) -> None:
    out = launch("+cluster=local_slurm", "cluster.partition=nosuchpart", "run.name=nopart",
                 f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: partition 'nosuchpart' does not exist")
    assert "debug" in out.stderr
    assert queued_jobs_named("nopart") == []
    assert not (run_root / "nopart").exists()


def test_time_limit_shorter_than_signal_lead_is_refused(run_root: Path) -> None:
    out = launch("+cluster=local_slurm", "cluster.time_limit_min=1", "cluster.signal_lead_s=90",
                 "run.name=short", f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert "raise cluster.time_limit_min above 2" in out.stderr
    assert queued_jobs_named("short") == []


def test_submission_returns_at_once_with_job_id_and_logs(run_root: Path) -> None:
    out = launch("+cluster=local_slurm", "trainer.max_steps=3", "logger.backend=none", "run.name=nowait",
                 f"run.root={hq(run_root)}")
    assert out.returncode == 0, out.stderr
    job_id = submitted_job_id(out.stdout)
    assert f"scancel {job_id}" in out.stdout and "tail -f" in out.stdout
    assert wait_terminal(job_id) == "COMPLETED"
    poll(lambda: (run_root / "nowait" / "metrics.jsonl").is_file(), 30, "metrics")
    assert read_metrics(run_root / "nowait")[-1]["step"] == 3


def test_plain_sbatch_script_completes(run_root: Path) -> None:
    # The hand-usable script, with its GPU lines overridden on the command line for this CPU cluster.
    out = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1",
         "--time=10", f"--output={run_root}/sbatch-%j.out", str(ROOT / "sbatch" / "multi_node.sbatch"),
         "trainer.max_steps=4", "logger.backend=none", f"run.root={hq(run_root)}", "run.name=plain"],
        capture_output=True, text=True, env=launcher_env(SLURMTRAIN_PYTHON=sys.executable), cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    assert wait_terminal(job_id) == "COMPLETED", (run_root / f"sbatch-{job_id}.out").read_text()
    assert read_metrics(run_root / "plain")[-1]["step"] == 4
    assert_on_two_nodes((run_root / f"sbatch-{job_id}.out").read_text())
