"""Unexpected failures on the real local cluster (3 nodes): a rank that raises gets its job requeued without its
node and the run ends bitwise where an uninterrupted run ends; one run survives a preemption, a hang and a crash
(the hung and the crashed hosts left out) with the right events and goodput; the failure budget and configuration
errors end the job for good."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from contract.rundir.events import read_events
from tests.conftest import hq, launch, launcher_env, read_metrics
from tests.slurm.helpers import (
    logged_steps,
    poll,
    release_requeued,
    sacct_state,
    squeue_state,
    submitted_job_id,
    wait_terminal,
)

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
    _start_when_pending(job_id, 1, run_dir, excluded=1)
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


def _hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True).stdout.split()


def _start_when_pending(job_id: str, events: int, run_dir: Path, excluded: int) -> None:
    """After the attempt's end is recorded (`events` lines), release the requeued job as an operator would, once
    `excluded` hosts are left out of it."""
    poll(lambda: len(read_events(run_dir)) >= events, 180, f"event {events}")
    poll(lambda: squeue_state(job_id) == "PENDING", 180, "the job to be requeued")
    if excluded:
        poll(lambda: len(_hostnames(_excluded(job_id))) >= excluded if _excluded(job_id) != "(null)" else False, 60,
             f"{excluded} host(s) to be left out")

    release_requeued(job_id, 180)

    def started() -> bool:
        # Until the requeue has settled SLURM may set its begin time again: repeat until the job leaves PENDING.
        if squeue_state(job_id) != "PENDING":
            return True
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True)
        return False

    poll(started, 180, "the requeued job to start", interval=2.0)


LONG = 150  # steps: time for the preemption signal to land well before the injected faults


def test_a_run_with_a_preemption_a_hang_and_a_crash_ends_bitwise_with_its_events_and_goodput(run_root: Path) -> None:
    """One 1-node job, 2 ranks: USR1 in attempt 0; rank 1 hangs at step 110 in attempt 1 (its host is left out);
    rank 0 raises at step 130 in attempt 2 (its host is left out too: the third node remains); attempt 3 finishes."""
    common = [f"trainer.max_steps={LONG}", "trainer.log_every=1", "trainer.ckpt_every=5", "+cluster=local_slurm",
              "cluster.nodes=1", "cluster.tasks_per_node=2", "logger.backend=none", f"run.root={hq(run_root)}"]
    reference = launch(*common[:3], "local.nproc=2", f"run.root={hq(run_root)}", "run.name=ref",
                       "logger.backend=none")
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = launch(*common, "run.name=faults", "watchdog.step_timeout_s=4", SLURMTRAIN_TEST_HANG="1:110:1",
                 SLURMTRAIN_TEST_RAISE="0:130:2")
    assert out.returncode == 0, out.stderr
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "faults"
    poll(lambda: logged_steps(run_dir) >= 5, 180, "training to start")
    subprocess.run(["scancel", "--signal=USR1", "--full", job_id], check=True)
    _start_when_pending(job_id, 1, run_dir, excluded=0)
    _start_when_pending(job_id, 2, run_dir, excluded=1)
    _start_when_pending(job_id, 3, run_dir, excluded=2)
    assert wait_terminal(job_id, timeout=300) == "COMPLETED"

    events = read_events(run_dir)
    assert [e["kind"] for e in events] == ["preempted", "hung", "crashed", "finished"], events
    assert [e["attempt"] for e in events] == [0, 1, 2, 3]
    log = (run_dir / "slurm" / f"{job_id}_0_log.err").read_text()
    resumed = [int(m) for m in re.findall(r"resumed from .*step_\d+: step (\d+)", log)]
    preempted, hung, crashed, finished = events
    assert preempted["steps_lost"] == 0 and preempted["step"] == resumed[0] < 110  # the stop step itself is saved
    assert hung["step"] == 109 and hung["steps_lost"] == 109 - resumed[1] and resumed[1] == 105
    assert crashed["step"] == 129 and crashed["steps_lost"] == 129 - resumed[2] and resumed[2] == 125
    assert finished["step"] == LONG
    # The hung rank (1) is named by every dump, and its host is the one left out.
    headers = {r: json.loads((run_dir / "hangs" / f"rank{r}.txt").read_text().splitlines()[0]) for r in (0, 1)}
    assert headers[0]["last_finished_step"] == headers[1]["last_finished_step"] == 109
    assert all(h["fired_at"] - h["entered_at"] <= 4 + 1.5 for h in headers.values())
    assert hung["host"] == headers[1]["host"] and crashed["host"] != hung["host"]
    attempts = [_hostnames(nodes) for nodes, _ in _nodes_per_attempt(job_id)]
    assert len(attempts) == 4 and attempts[1] == [hung["host"]] and attempts[2] == [crashed["host"]], attempts
    assert attempts[3][0] not in (hung["host"], crashed["host"])
    # Every step once, and the losses of an uninterrupted run, bitwise.
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, LONG + 1))
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(run_root / "ref")]
    # Goodput: steps that counted (each once, at the median step time) over the attempts' time, which agrees
    # with SLURM's own accounting of the four attempts.
    status = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"], capture_output=True,
                            text=True, env=launcher_env(), timeout=120)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)["rows"][0]
    assert row["events"] == {"preempted": 1, "hung": 1, "crashed": 1, "finished": 1}
    spent = sum(e["ended"] - e["started"] for e in events)
    elapsed = _elapsed_per_attempt(job_id)
    assert len(elapsed) == 4 and all(e["ended"] - e["started"] <= s + 2 for e, s in zip(events, elapsed, strict=True))
    useful = LONG * statistics.median(r["step_time_s"] for r in rows)
    assert row["goodput"] == pytest.approx(useful / spent, rel=1e-6) and 0 < row["goodput"] < 1


def _elapsed_per_attempt(job_id: str) -> list[int]:
    out = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "ElapsedRaw"], capture_output=True,
                         text=True).stdout
    return [int(line) for line in out.split()]


def test_the_failure_budget_and_configuration_errors_end_the_job_for_good(run_root: Path, tmp_path: Path) -> None:
    budget = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=budget", "logger.backend=none",
                    "cluster.max_failures=0", SLURMTRAIN_TEST_RAISE="0:3")
    # Input that is fine at launch and gone by the time the job runs: the token file, removed while the job is
    # held in the queue.
    tokens = tmp_path / "tokens.bin"
    np.arange(4096, dtype=np.uint16).tofile(tokens)
    bad_data = launch(*COMMON, "data=tokens", f"data.path={hq(tokens)}", "model.vocab_size=4096",
                      "+cluster.extra_sbatch.hold=true", "logger.backend=none", f"run.root={hq(run_root)}",
                      "run.name=baddata")
    assert budget.returncode == 0 and bad_data.returncode == 0, (budget.stderr, bad_data.stderr)
    jobs = {"budget": submitted_job_id(budget.stdout), "baddata": submitted_job_id(bad_data.stdout)}
    tokens.unlink()
    subprocess.run(["scontrol", "release", jobs["baddata"]], check=True)
    for name, job_id in jobs.items():
        assert wait_terminal(job_id, timeout=240) == "FAILED", name
        history = [state for _, state in _nodes_per_attempt(job_id)]
        assert history == ["FAILED"], (name, history)  # never requeued
    log = (run_root / "budget" / "slurm" / f"{jobs['budget']}_0_log.err").read_text()
    assert "cluster.max_failures=0: not requeueing" in log
    assert [e["kind"] for e in read_events(run_root / "budget")] == ["crashed", "limit_reached"]
    err = (run_root / "baddata" / "slurm" / f"{jobs['baddata']}_0_log.err").read_text()
    assert f"error: data.path={tokens} is not a file here (was it moved after submitting?)" in err
    assert "Traceback" not in err
    assert not (run_root / "baddata" / "events.jsonl").exists() or all(
        e["kind"] not in ("crashed", "hung") for e in read_events(run_root / "baddata"))
    assert sacct_state(jobs["budget"]) == "FAILED"
