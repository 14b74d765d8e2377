"""How an attempt's end is recorded: a user's cancel is told from a failure by SLURM's own word (fake scontrol and
sacct here; tests/slurm/test_cancel.py does it for real), and local attempts are numbered over the run directory."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.observe.events import LOCAL_ATTEMPTS_FILE, read_events, record_event, start_local_attempt
from train import recovery
from train.preemption import StopOutcome


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_state: str, sacct_state: str = "") -> Path:
    """scontrol and sacct that answer for one job and log every call to calls.txt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    scontrol = f"""#!/bin/sh
echo "scontrol $*" >> '{calls}'
if [ "$1" = show ] && [ "$2" = job ]; then
  echo "JobId=$3 JobName=x"
  echo "   JobState={job_state} Reason=None Dependency=(null)"
  echo "   ReqNodeList=(null) ExcNodeList=(null)"
fi
"""
    sacct = f"""#!/bin/sh
echo "sacct $*" >> '{calls}'
[ -n '{sacct_state}' ] && echo "7|{sacct_state}|12|cpu=2|2"
exit 0
"""
    for name, text in (("scontrol", scontrol), ("sacct", sacct)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    return calls


@pytest.mark.parametrize(("job_state", "sacct_state", "expected"), [
    ("COMPLETING", "CANCELLED by 0", True),  # scancel while the ranks still run: only the accounting has the cause
    ("CANCELLED", "", True),
    ("RUNNING", "", False),  # srun ended the step of a failed rank: the job runs on, a real failure
    ("COMPLETING", "REQUEUED", False),
    ("COMPLETING", "", False),  # no accounting to ask: a failure, as before
])
def test_a_cancel_is_what_slurm_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_state: str,
                                     sacct_state: str, expected: bool) -> None:
    calls = fake_slurm(tmp_path, monkeypatch, job_state, sacct_state)
    assert recovery.cancelled("7") is expected
    assert ("sacct" in calls.read_text()) is (job_state == "COMPLETING")


def test_no_scontrol_is_no_cancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert recovery.cancelled("7") is False


CFG = OmegaConf.create({"cluster": {"max_failures": 3, "nodes": 2, "partition": None}})


def test_a_rank_that_fails_of_a_cancel_records_cancelled_and_neither_requeues_nor_leaves_a_node_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_slurm(tmp_path, monkeypatch, "COMPLETING", "CANCELLED by 0")
    err = RuntimeError("Read error [127.0.0.1]:31138: Connection reset by peer")
    monkeypatch.setattr(recovery, "SECONDARY_WAIT_S", 0.0)
    recovery.recover(CFG, tmp_path, "crashed", 4, "n2", err, started=1.0, is_main=True)
    [event] = read_events(tmp_path)
    assert event["kind"] == "cancelled" and event["job"] == "7" and event["step"] == 4
    assert "Connection reset by peer" in event["error"]
    assert "requeue" not in calls.read_text() and "update" not in calls.read_text()
    assert not list(tmp_path.glob("exclude-*.log"))


def test_a_real_failure_still_requeues_and_leaves_its_node_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_slurm(tmp_path, monkeypatch, "RUNNING")
    monkeypatch.setattr(recovery, "usable_nodes", lambda partition: ["n1", "n2", "n3"])
    monkeypatch.setattr(recovery, "exclude_when_pending", lambda run_dir, job, hosts: calls.open("a").write(
        f"exclude {job} {','.join(hosts)}\n"))
    recovery.recover(CFG, tmp_path, "crashed", 4, "n2", RuntimeError("injected"), started=1.0, is_main=True)
    assert [e["kind"] for e in read_events(tmp_path)] == ["crashed"]
    assert "scontrol requeue 7" in calls.read_text() and "exclude 7 n2" in calls.read_text()


@pytest.mark.parametrize(("outcome", "kind"), [
    (StopOutcome(0, None, stopped=True), "cancelled"),  # SIGTERM from scancel: checkpointed, then cancelled
    (StopOutcome(0, "7"), "cancelled"),  # cancelled while stopping for a preemption: never requeued
])
def test_a_stop_during_a_cancel_is_recorded_as_cancelled_and_not_requeued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: StopOutcome, kind: str) -> None:
    fake_slurm(tmp_path, monkeypatch, "COMPLETING", "CANCELLED by 0")
    assert recovery.end_of_attempt(tmp_path, outcome, 5, started=0.0) is None
    assert [e["kind"] for e in read_events(tmp_path)] == [kind]


def test_a_preemption_stop_still_requeues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, "RUNNING")
    assert recovery.end_of_attempt(tmp_path, StopOutcome(0, "7"), 5, started=0.0) == "7"
    assert [e["kind"] for e in read_events(tmp_path)] == ["preempted"]


def test_local_attempts_are_numbered_over_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(recovery, "_local_attempt", 0)
    assert start_local_attempt(tmp_path) == 0
    assert start_local_attempt(tmp_path) == 1  # attempt 0 died without recording its end: 1 is next anyway
    recovery.begin_attempt(tmp_path, is_main=True)
    assert recovery.attempt() == 2
    assert [line.split()[0] for line in (tmp_path / LOCAL_ATTEMPTS_FILE).read_text().splitlines()] == ["0", "1", "2"]
    # A run directory from before the ledger: its ends were all recorded as attempt 0, each one an attempt.
    old = tmp_path / "old"
    old.mkdir()
    for _ in range(3):
        record_event(old, "stopped", attempt=0, job=None)
    record_event(old, "preempted", attempt=5, job="42")  # a SLURM job's attempts are SLURM's to count
    assert start_local_attempt(old) == 3
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")
    assert recovery.attempt() == 4
