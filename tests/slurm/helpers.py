"""Polling helpers for the real local cluster: every wait is bounded and re-reads SLURM's own state."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable

import pytest

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
