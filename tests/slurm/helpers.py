"""Polling helpers for the real local cluster: every wait is bounded and re-reads SLURM's own state."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.rundir.metrics_file import read_metrics

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def poll(check: Callable[[], object], timeout: float, what: str, interval: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True)
    lines = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def wait_terminal(job_id: str, timeout: float = 240) -> str:
    return str(poll(lambda: (s := sacct_state(job_id)).startswith(TERMINAL) and s, timeout, f"job {job_id} to end"))


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def queued_jobs_named(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


def submitted_job_id(stdout: str) -> str:
    match = re.search(r"submitted job (\d+)", stdout)
    assert match, stdout
    return match.group(1)


def logged_steps(run_dir: Path) -> int:
    """Rows in RUN_DIR/metrics.jsonl so far (0 before training starts; a torn last line is not a row yet)."""
    return len(read_metrics(run_dir))


def release_requeued(job_id: str, timeout: float = 120) -> None:
    """Start a job that requeued itself now, as an operator would, instead of at its BeginTime. slurmd refuses a
    credential issued in the same whole second as its job's revocation ("Job credential revoked": the job ends
    FAILED), and SLURM's own begin-time delay is what normally avoids that: so release in a later second than the
    one in which the job was seen PENDING (squeue shows COMPLETING until the node has let the old attempt go)."""
    poll(lambda: squeue_state(job_id) == "PENDING", timeout, f"job {job_id} to be requeued")
    settled = int(time.time()) + 1
    poll(lambda: time.time() >= settled, 5, "the next second", interval=0.1)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)


def preempt_and_release(job_id: str, run_dir: Path) -> str:
    """USR1 to every rank once the run logged 5 steps; the job checkpoints and requeues itself and waits for its
    BeginTime, so release it as an operator would. Returns the job's final state."""
    poll(lambda: logged_steps(run_dir) >= 5, 180, "training to start")
    subprocess.run(["scancel", "--signal=USR1", "--full", job_id], check=True)
    release_requeued(job_id)
    return wait_terminal(job_id, timeout=300)


def assert_on_two_nodes(log: str) -> None:
    """The job's ranks said they run on two distinct nodes (whichever two of n1-n3 SLURM gave it: a job of an
    earlier test may still hold one)."""
    found = re.search(r"world of 2 ranks on 2 host\(s\): (n\d), (n\d)", log)
    assert found and found.group(1) != found.group(2), log[-3000:]
