"""Failure paths a real cluster can't produce on demand: requeue limits, torchrun under SLURM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.conftest import hq, launch
from train.distributed import DistEnv
from train.entry import check_launch
from train.faults.preemption import STOP, RequeueLimitReached, StopOutcome, after_stop, slurm_job_id


def _env(launcher: str) -> DistEnv:
    return DistEnv(rank=1, local_rank=0, world_size=2, local_world_size=1, master_addr="n1", master_port=1,
                   launcher=launcher, node="n2")


def test_requeue_limit_ends_the_job_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    cfg = OmegaConf.create({"cluster": {"max_requeues": 3}})
    with pytest.raises(RequeueLimitReached, match=r"requeued 3 times \(cluster.max_requeues=3\)"):
        after_stop(_env("slurm"), cfg, step=17)


def test_requeues_after_crashes_and_hangs_do_not_count_against_the_preemption_limit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from contract.rundir.events import record_event

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    rank0 = DistEnv(0, 0, 2, 1, "n1", 1, "slurm", "n1")
    cfg = OmegaConf.create({"cluster": {"max_requeues": 3}})
    record_event(tmp_path, "preempted", job="42")
    record_event(tmp_path, "crashed", job="42")
    record_event(tmp_path, "hung", job="41")  # another job's failure (an earlier submission): not this job's requeue
    with pytest.raises(RequeueLimitReached):  # 3 restarts, 1 after a crash: 2 preemption requeues, the limit
        after_stop(rank0, OmegaConf.create({"cluster": {"max_requeues": 2}}), 5, run_dir=tmp_path)
    record_event(tmp_path, "hung", job="42")
    assert after_stop(rank0, cfg, 5, run_dir=tmp_path) == StopOutcome(0, "42")  # 1 preemption of 3


def test_below_the_limit_non_zero_ranks_leave_the_requeue_to_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("PATH", "/nonexistent")  # rank 1 must not even try scontrol
    outcome = after_stop(_env("slurm"), OmegaConf.create({"cluster": {"max_requeues": 3}}), step=17)
    assert outcome == StopOutcome(0, None)


def test_rank_0_requeues_jobs_from_sbatch_scripts_with_the_default_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # sbatch/ scripts compose without +cluster: the schema's default max_requeues (3) applies, not 0.
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    rank0 = DistEnv(0, 0, 2, 1, "n1", 1, "slurm", "n1")
    assert after_stop(rank0, OmegaConf.create({"cluster": None}), step=5) == StopOutcome(0, "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    with pytest.raises(RequeueLimitReached, match="max_requeues=3"):
        after_stop(rank0, OmegaConf.create({"cluster": None}), step=5)


def test_sigterm_saves_but_does_not_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    rank0 = DistEnv(0, 0, 2, 1, "n1", 1, "slurm", "n1")
    outcome = after_stop(rank0, OmegaConf.create({"cluster": {"max_requeues": 3}}), 5, agreed=STOP)
    assert outcome == StopOutcome(0, None, stopped=True)  # exit 0 for SLURM, but not a finished run


def test_an_attempt_stopped_by_sigterm_is_recorded_as_stopped(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    from contract.rundir.events import read_events
    from train.faults import recovery
    from train.faults.recovery import end_of_attempt

    monkeypatch.setattr(recovery, "cancelled", lambda job: False)  # SLURM's word on a cancel: test_attempt_ends.py
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    rank0 = DistEnv(0, 0, 2, 1, "n1", 1, "slurm", "n1")
    outcome = after_stop(rank0, OmegaConf.create({"cluster": {"max_requeues": 3}}), 5, agreed=STOP)
    end_of_attempt(tmp_path, outcome, 5, started=0.0)
    end_of_attempt(tmp_path, StopOutcome(0, None), 9, started=0.0)  # reached max_steps
    assert [(e["kind"], e["step"]) for e in read_events(tmp_path)] == [("stopped", 5), ("finished", 9)]


def test_array_tasks_requeue_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "100")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert slurm_job_id() == "100_1"


def test_torchrun_inside_slurm_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        check_launch({"TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_ID": "7"})
    assert exit_.value.code == 2
    assert "one srun task per GPU" in capsys.readouterr().err
    check_launch({"TORCHELASTIC_RUN_ID": "x"})  # torchrun outside SLURM is fine


def test_torchrun_launch_config_is_refused(run_root: Path) -> None:
    out = launch("+cluster=a100x16", "cluster.launch=torchrun", "launcher.dry_run=true", f"run.root={hq(run_root)}")
    assert out.returncode == 2
    assert "cluster.launch=srun" in out.stderr


def test_a_long_error_keeps_its_head_and_its_cause() -> None:
    from train.faults.recovery import error_summary

    err = RuntimeError("Traceback (most recent call last): (RANK 0)\n" + "  frame\n" * 200 + "OSError: disk full")
    summary = error_summary(err)
    assert len(summary) <= 600
    assert summary.startswith("RuntimeError: Traceback") and summary.endswith("OSError: disk full")
    assert error_summary(ValueError("short")) == "ValueError: short"


def test_a_deliberate_exit_logs_no_traceback(caplog: Any) -> None:
    """A replica group started to heal that finds no live group exits EXIT_NO_PEER (73), having said why: its log
    got "Traceback ... SystemExit: 73" after that line. A real error keeps its traceback."""
    from contract.rundir.replicas import EXIT_NO_PEER
    from train.faults.recovery import log_failure
    from train.observe.metrics import log

    log.addHandler(caplog.handler)
    try:
        with caplog.at_level("DEBUG", logger=log.name):
            assert log_failure(SystemExit(EXIT_NO_PEER)) is False
            assert not caplog.records
            try:
                raise RuntimeError("a real failure")
            except RuntimeError as err:
                log_failure(err)
            assert caplog.records and caplog.records[-1].exc_info is not None
    finally:
        log.removeHandler(caplog.handler)


def test_the_launcher_blames_the_rank_that_failed_not_the_one_that_lost_its_peer(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from launcher.run.local import WorkerGroup

    logs = [tmp_path / "rank_0.log", tmp_path / "rank_1.log"]
    logs[0].write_text("step 1\nDistBackendError: [../gloo/transport/tcp/pair.cc] Connection closed by peer\n")
    logs[1].write_text("step 1\nRuntimeError: injected failure on rank 1 at step 2\n")
    group = SimpleNamespace(log_paths=logs)
    assert WorkerGroup.first_failure(group, [(0, 1), (1, 1)]) == (1, 1)  # type: ignore[arg-type]
    logs[1].write_text("Broken pipe\n")  # both lost a peer: the lowest rank, as before
    assert WorkerGroup.first_failure(group, [(0, 1), (1, 1)]) == (0, 1)  # type: ignore[arg-type]
