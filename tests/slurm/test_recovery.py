"""Unexpected failures on the real local cluster (3 nodes): a rank that raises gets its job requeued without its
node and the run ends bitwise where an uninterrupted run ends; a hang ends in stack dumps and a requeue; the
failure budget and configuration errors end the job for good."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from launcher.events import read_events
from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import poll, sacct_state, squeue_state, submitted_job_id, wait_terminal

pytestmark = pytest.mark.slurm

STEPS = 40
COMMON = [f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.ckpt_every=5", "+cluster=local_slurm"]


def _nodes_per_attempt(job_id: str) -> list[tuple[str, str]]:
    out = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "NodeList,State"],
                         capture_output=True, text=True).stdout
    return [tuple(line.split("|")[:2]) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def _excluded(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("ExcNodeList=")), "(null)")


def _release_when_pending(job_id: str, run_dir: Path, excluded: bool = False) -> None:
    # A requeued job waits for its BeginTime; release it as an operator would (as the preemption tests do), once
    # the failed node is left out when that is expected.
    poll(lambda: any(e["kind"] in ("crashed", "hung") for e in read_events(run_dir)), 180, "the failure")
    poll(lambda: squeue_state(job_id) == "PENDING", 180, "the job to be requeued")
    if excluded:
        poll(lambda: _excluded(job_id) != "(null)", 60, "the failed node to be left out")

    def started() -> bool:
        # Until the requeue has settled SLURM may set its begin time again: repeat until the job leaves PENDING.
        if squeue_state(job_id) != "PENDING":
            return True
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True)
        return False

    poll(started, 180, "the requeued job to start", interval=2.0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    root = tmp_path_factory.mktemp("ref")
    out = launch(*COMMON[:3], "local.nproc=2", f"run.root={root}", "run.name=ref", "logger.backend=none")
    assert out.returncode == 0, out.stderr[-3000:]
    return [r["loss"] for r in read_metrics(root / "ref")]


def test_a_rank_that_raises_is_requeued_without_its_node_and_ends_bitwise(run_root: Path,
                                                                        reference: list[float]) -> None:
    out = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=crash", "logger.backend=none",
                 SLURMTRAIN_TEST_RAISE="1:12:0")  # rank 1 raises at step 12 of the first attempt
    assert out.returncode == 0, out.stderr
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "crash"
    _release_when_pending(job_id, run_dir, excluded=True)
    assert wait_terminal(job_id, timeout=300) == "COMPLETED"
    crashed, finished = read_events(run_dir)
    log = (run_dir / "slurm" / f"{job_id}_0_log.err").read_text()
    resumed = re.search(r"resumed from .*step_(\d+): step (\d+)", log)
    assert resumed, log[-3000:]
    assert crashed["kind"] == "crashed" and crashed["step"] == 11
    assert crashed["steps_lost"] == 11 - int(resumed.group(2))  # the steps redone after the requeue
    assert "injected failure on rank 1" in crashed["error"] and finished["kind"] == "finished"
    bad = crashed["host"]
    attempts = _nodes_per_attempt(job_id)
    assert len(attempts) == 2 and bad in subprocess.run(["scontrol", "show", "hostnames", attempts[0][0]],
                                                        capture_output=True, text=True).stdout.split()
    last_nodes = subprocess.run(["scontrol", "show", "hostnames", attempts[-1][0]], capture_output=True,
                                text=True).stdout.split()
    assert bad not in last_nodes and len(last_nodes) == 2, attempts
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in rows] == reference


def test_a_hang_dumps_every_rank_and_the_job_requeues_and_completes(run_root: Path,
                                                                   reference: list[float]) -> None:
    out = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=hang", "logger.backend=none",
                 "watchdog.step_timeout_s=4", SLURMTRAIN_TEST_HANG="0:17:0")
    assert out.returncode == 0, out.stderr
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "hang"
    _release_when_pending(job_id, run_dir)
    assert wait_terminal(job_id, timeout=300) == "COMPLETED"
    for rank in (0, 1):
        header = json.loads((run_dir / "hangs" / f"rank{rank}.txt").read_text().splitlines()[0])
        assert header["last_finished_step"] == 16 and header["fired_at"] - header["entered_at"] <= 4 + 1.5
    assert [e["kind"] for e in read_events(run_dir)] == ["hung", "finished"]
    assert [r["loss"] for r in read_metrics(run_dir)] == reference


def test_the_failure_budget_and_configuration_errors_end_the_job_for_good(run_root: Path,
                                                                          byo_project: Path) -> None:
    budget = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=budget", "logger.backend=none",
                    "cluster.max_failures=0", SLURMTRAIN_TEST_RAISE="0:3")
    bad_data = launch("--config-dir", "conf", "model=conv_lm", "data=chars", "data.args.seq_len=48",
                      "+cluster=my_cluster", "trainer.max_steps=5", "logger.backend=none",
                      f"run.root={hq(run_root)}", "run.name=baddata", cwd=byo_project)
    assert budget.returncode == 0 and bad_data.returncode == 0, (budget.stderr, bad_data.stderr)
    jobs = {"budget": submitted_job_id(budget.stdout), "baddata": submitted_job_id(bad_data.stdout)}
    for name, job_id in jobs.items():
        assert wait_terminal(job_id, timeout=240) == "FAILED", name
        history = [state for _, state in _nodes_per_attempt(job_id)]
        assert history == ["FAILED"], (name, history)  # never requeued
    log = (run_root / "budget" / "slurm" / f"{jobs['budget']}_0_log.err").read_text()
    assert "cluster.max_failures=0: not requeueing" in log
    assert [e["kind"] for e in read_events(run_root / "budget")] == ["crashed", "limit_reached"]
    err = (run_root / "baddata" / "slurm" / f"{jobs['baddata']}_0_log.err").read_text()
    assert "error: data._target_=data.CharDataset gives samples of 48 input tokens but data.seq_len=64: " in err
    assert "make the dataset return 65 or set data.seq_len=48" in err
    assert not (run_root / "baddata" / "events.jsonl").exists() or all(
        e["kind"] not in ("crashed", "hung") for e in read_events(run_root / "baddata"))
    assert sacct_state(jobs["budget"]) == "FAILED"
