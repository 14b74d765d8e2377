"""How an attempt's end is recorded: a user's cancel is told from a failure by SLURM's own word (fake scontrol and
sacct here; tests/slurm/test_cancel.py does it for real), local attempts are numbered over the run directory, the
local launcher tells one interrupt delivered twice from a second Ctrl-C (a fake clock here;
tests/dist/test_local_attempts.py sends real signals) and records the end its ranks could not."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.rundir.events import LOCAL_ATTEMPTS_FILE, read_events, record_event, start_local_attempt
from launcher.run import local, local_ends
from train.faults import recovery
from train.faults.preemption import StopOutcome


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


class FakeWorker:
    """A running worker that notes the signals it is sent."""

    def __init__(self, pid: int) -> None:
        self.pid, self.sent = pid, []

    def poll(self) -> None:
        return None

    def send_signal(self, sig: int) -> None:
        self.sent.append(sig)


@pytest.mark.parametrize(("signals", "forwarded", "killed"), [
    # (seconds after the first, signal): GNU timeout signals its child, then its process group: one interrupt.
    ([(0.0, signal.SIGINT), (0.001, signal.SIGINT)], [signal.SIGUSR1], False),
    ([(0.0, signal.SIGINT), (0.9, signal.SIGINT)], [signal.SIGUSR1], False),
    ([(0.0, signal.SIGINT), (2.0, signal.SIGINT)], [signal.SIGUSR1, signal.SIGKILL], True),  # a second Ctrl-C
    ([(0.0, signal.SIGINT), (0.1, signal.SIGINT), (5.0, signal.SIGINT)], [signal.SIGUSR1, signal.SIGKILL], True),
    ([(0.0, signal.SIGTERM), (0.0, signal.SIGTERM)], [signal.SIGUSR1], False),
    ([(0.0, signal.SIGTERM), (3.0, signal.SIGTERM)], [signal.SIGUSR1, signal.SIGUSR1], False),  # never a kill
    ([(0.0, signal.SIGUSR1), (3.0, signal.SIGINT)], [signal.SIGUSR1, signal.SIGKILL], True),
])
def test_signals_that_arrive_together_are_one_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        signals: list[tuple[float, int]], forwarded: list[int],
                                                        killed: bool) -> None:
    monkeypatch.delenv(local.INTERRUPT_WINDOW_ENV, raising=False)
    group = local.WorkerGroup(tmp_path / "config.yaml", 2)
    group.procs = [FakeWorker(100), FakeWorker(101)]  # type: ignore[list-item]
    now = [1000.0]
    monkeypatch.setattr(local.time, "monotonic", lambda: now[0])
    try:
        for at, sig in signals:
            now[0] = 1000.0 + at
            group.on_interrupt(sig, None)
    finally:
        group.cleanup()
    assert [w.sent for w in group.procs] == [forwarded, forwarded]  # type: ignore[attr-defined]
    assert group.killed is killed


class EndedWorker(FakeWorker):
    def poll(self) -> int:  # type: ignore[override]
        return 75


@pytest.mark.parametrize("how", ["stop recorded", "workers ended"])
def test_a_second_ctrl_c_after_a_clean_stop_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], how: str) -> None:
    """Issue 27's trial: 'stopped at step 13 with a complete checkpoint' (recorded), then a second SIGINT 1.5 s later
    while the workers were exiting printed 'stopping the workers now' and the launcher exited 130, not 75."""
    monkeypatch.delenv(local.INTERRUPT_WINDOW_ENV, raising=False)
    group = local.WorkerGroup(tmp_path / "config.yaml", 2)
    worker = FakeWorker if how == "stop recorded" else EndedWorker
    group.procs = [worker(os.getpid()), worker(os.getpid() + 1)]  # type: ignore[list-item]
    now = [1000.0]
    monkeypatch.setattr(local.time, "monotonic", lambda: now[0])
    try:
        group.on_interrupt(signal.SIGINT, None)
        if how == "stop recorded":  # rank 0 numbered its attempt and recorded its stop
            number = start_local_attempt(tmp_path, pid=os.getpid(), start_time=group.started + 1)
            record_event(tmp_path, "stopped", attempt=number, job=None, step=13, steps_lost=0)
        now[0] = 1001.5
        group.on_interrupt(signal.SIGINT, None)
    finally:
        group.cleanup()
    assert not group.killed and [w.sent for w in group.procs] == [  # type: ignore[attr-defined]
        [signal.SIGUSR1] if how == "stop recorded" else [], [signal.SIGUSR1] if how == "stop recorded" else []]
    err = capsys.readouterr().err
    assert "stopping the workers now" not in err and "already stopped" in err
    # A stop not yet recorded by workers still running: the second Ctrl-C stops them at once, as before.
    other = local.WorkerGroup(tmp_path / "other" / "config.yaml", 1)
    other.procs = [FakeWorker(os.getpid())]  # type: ignore[list-item]
    try:
        other.on_interrupt(signal.SIGINT, None)
        now[0] = 1003.0
        other.on_interrupt(signal.SIGINT, None)
    finally:
        other.cleanup()
    assert other.killed and other.procs[0].sent == [signal.SIGUSR1, signal.SIGKILL]  # type: ignore[attr-defined]


def test_the_launcher_records_an_end_no_rank_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from contract.rundir import ckpt_layout
    from contract.rundir.metrics_file import FILE_NAME

    record_event(tmp_path, "stopped", attempt=0, job=None, step=3)
    (tmp_path / FILE_NAME).write_text("".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in range(1, 8)))
    ckpt_layout.step_dir(tmp_path, 6).mkdir(parents=True)
    ckpt_layout.write_marker(ckpt_layout.step_dir(tmp_path, 6), step=6)
    # Rank 0 (pid 4242) died before it numbered its attempt: numbered now, as started when its workers started.
    end = local_ends.record_end(tmp_path, 4242, 123.0, "killed")
    assert end is not None and (end["attempt"], end["step"], end["steps_lost"], end["started"]) == (1, 7, 1, 123.0)
    assert local_ends.record_end(tmp_path, 4242, 123.0, "crashed") is None  # one end per attempt
    # A rank 0 that numbered its attempt and recorded its end: nothing more.
    monkeypatch.setattr(recovery, "_local_attempt", 0)
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    recovery.begin_attempt(tmp_path, is_main=True)
    record_event(tmp_path, "finished", attempt=recovery.attempt(), job=None, step=7)
    assert local_ends.record_end(tmp_path, os.getpid(), 0.0, "crashed") is None
    assert [(e["kind"], e["attempt"]) for e in read_events(tmp_path)] == [("stopped", 0), ("killed", 1),
                                                                           ("finished", 2)]


def test_killed_is_an_end_that_loses_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    from contract.rundir import events

    record_event(tmp_path, "killed", attempt=0, job=None, step=7, steps_lost=7, started=0.0, ended=10.0)
    ends = read_events(tmp_path)
    metrics = [{"step": s, "step_time_s": 1.0} for s in range(1, 8)]
    assert events.ending_state(ends, ends[-1]) == "killed"
    assert events.kept_step(ends, metrics, 4, ends[-1]) == 4
    assert events.goodput(ends, metrics, 4) == pytest.approx(0.4)
    events.settle_steps_lost(tmp_path, 4)  # the resume knows: 3 steps lost
    assert read_events(tmp_path)[-1]["steps_lost"] == 3
    assert not events.is_failure(ends[-1])  # a person's choice, not a failure of the run
