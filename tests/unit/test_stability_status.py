"""How a run that stability stopped, or that crashed, ends: the stop line's advice (train/stability/advice.py) is a
command that works as written, and launcher.status shows the step of the end, the end's state and a goodput in
[0, 100%]."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import ckpt_layout, events
from contract.rundir.events import record_event
from launcher import status
from tests.unit.test_status import FakeSlurm, sacct_line, slurm, write_run  # noqa: F401 - slurm is a fixture
from train.stability.advice import stop_advice

COMMAND = "/usr/bin/python3 -m launcher trainer.max_steps=30 run.root=/tmp/w run.name=a optim.lr=0.1 local.nproc=2\n"


def _args(line: str, marker: str) -> list[str]:
    return shlex.split(line.split(marker, 1)[1].split(";")[0].split(" (")[0])


def test_the_stop_advice_with_a_checkpoint_is_a_new_run_from_its_weights_at_a_lower_rate(tmp_path: Path) -> None:
    (tmp_path / "command.txt").write_text("python -m launcher run.name=old\n" + COMMAND)
    good = ckpt_layout.step_dir(tmp_path, 20)
    line = stop_advice(tmp_path, good=20, lr=0.1, run_name="a")
    assert "run the same command" not in line
    args = _args(line, "with a lower learning rate (half): ")
    assert args[:3] == ["/usr/bin/python3", "-m", "launcher"]
    assert f"model.init_from={good}" in args and "optim.lr=0.05" in args and "run.name=a-lr0.05" in args
    # The old values are replaced, not repeated (Hydra refuses a key given twice); the rest of the command is kept.
    assert [a.split("=")[0] for a in args].count("optim.lr") == 1
    assert [a.split("=")[0] for a in args].count("run.name") == 1
    assert "run.root=/tmp/w" in args and "local.nproc=2" in args and "trainer.max_steps=30" in args


def test_the_stop_advice_without_a_checkpoint_says_so_and_starts_over(tmp_path: Path) -> None:
    line = stop_advice(tmp_path, good=None, lr=3e-4, run_name="a")  # no command.txt: an sbatch script by hand
    assert "nothing was checkpointed" in line and "resume" not in line and "none" not in line
    # Starting over is a real change of rate (issue 27's trial: halving from dead weights went round in circles).
    args = _args(line, "with a lower learning rate (10x lower): ")
    assert "optim.lr=3e-05" in args and "run.overwrite=true" in args and "run.name=a" in args
    assert f"run.root={tmp_path.parent}" in args  # the same run directory, the overrides left to the user
    assert not any(a.startswith("model.init_from=") for a in args)


def test_starting_over_keeps_the_weights_the_run_started_from(tmp_path: Path) -> None:
    """A fine-tuning run that diverged before its first good checkpoint starts over from the same weights."""
    (tmp_path / "command.txt").write_text(COMMAND.strip() + " model.init_from=/w/base\n")
    line = stop_advice(tmp_path, good=None, lr=0.1, run_name="a")
    args = _args(line, "with a lower learning rate (10x lower): ")
    assert "model.init_from=/w/base" in args and "optim.lr=0.01" in args and "run.overwrite=true" in args
    assert [a.split("=")[0] for a in args].count("optim.lr") == 1
    assert "from before the trouble" in line


def _timed_rows(steps: list[int], loss: float = 2.0) -> str:
    return "".join(json.dumps({"step": s, "loss": loss, "step_time_s": 1.0}) + "\n" for s in steps)


def _diverged_run(run_dir: Path, skipped: list[int]) -> None:
    write_run(run_dir, name="d", max_steps=30, checkpoints={10: True, 20: True})
    (run_dir / "metrics.jsonl").write_text(_timed_rows([1]))  # log_every=50: one row, the first step's
    for step in skipped:
        record_event(run_dir, "skipped_step", job=None, step=step, reason="nonfinite", samples=[0, 8])
    record_event(run_dir, "diverged", attempt=0, job=None, host="h", step=30, steps_lost=0, started=0.0, ended=60.0)


def test_a_diverged_run_shows_the_step_of_the_stop_its_state_and_a_goodput_in_range(tmp_path: Path,
                                                                                      capsys: Any) -> None:
    run_dir = tmp_path / "d"
    _diverged_run(run_dir, skipped=[3, 4, 5, 25, 26, 27, 28, 29])
    assert status.main([str(run_dir), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["step"] == 30 and row["checkpoint_step"] == 20 and row["state"] == "diverged"
    # 20 steps kept (to the checkpoint), 3 of them not applied; the 10 after it are discarded: 17 s of 60 s.
    assert row["goodput"] == pytest.approx(17 / 60)


def test_goodput_stays_in_range_when_skipped_steps_outnumber_the_logged_steps() -> None:
    ends = [{"kind": "skipped_step", "step": s} for s in range(2, 9)]
    ends.append({"kind": "diverged", "step": 9, "started": 0.0, "ended": 10.0})
    metrics = [{"step": 1, "step_time_s": 1.0}]
    assert 0.0 <= events.goodput(ends, metrics) <= 1.0  # was 1 - 7 steps: negative
    assert events.goodput(ends, metrics, kept_step=0) == 0.0  # nothing kept (no checkpoint): none of it counted
    finished = [{"kind": "finished", "step": 4, "started": 0.0, "ended": 1.0}]
    assert events.goodput(finished, [{"step": 4, "step_time_s": 1.0}]) == 1.0


def test_the_step_is_never_below_the_newest_checkpoint(tmp_path: Path, capsys: Any) -> None:
    run_dir = tmp_path / "r"
    write_run(run_dir, name="r", max_steps=30, losses=[2.0], checkpoints={20: True, 25: False})
    row = json.loads(status.main([str(run_dir), "--json"]) == 0 and capsys.readouterr().out)["rows"][0]
    assert row["step"] == 20 and row["state"] == "stopped"


def test_a_local_crash_not_run_again_shows_crashed_and_a_later_attempt_does_not(tmp_path: Path, capsys: Any) -> None:
    run_dir = tmp_path / "c"
    write_run(run_dir, name="c", max_steps=30, losses=[2.0], checkpoints={10: True})
    events.start_local_attempt(run_dir)
    record_event(run_dir, "crashed", attempt=0, job=None, host="h", step=14, steps_lost=4, started=0.0, ended=9.0)
    row = json.loads(status.main([str(run_dir), "--json"]) == 0 and capsys.readouterr().out)["rows"][0]
    assert row["state"] == "crashed" and row["step"] == 14
    events.start_local_attempt(run_dir)  # run again (by this live process): the crash is behind it
    row = json.loads(status.main([str(run_dir), "--json"]) == 0 and capsys.readouterr().out)["rows"][0]
    assert row["state"] == "running" and row["step"] == 10  # it said "stopped" of a run still training
    import subprocess

    gone_pid = subprocess.Popen(["true"])  # a process that has ended: its pid is free
    gone_pid.wait()
    events.start_local_attempt(run_dir, pid=gone_pid.pid)  # an attempt SIGKILLed before it could record its end
    row = json.loads(status.main([str(run_dir), "--json"]) == 0 and capsys.readouterr().out)["rows"][0]
    assert row["state"] == "died" and row["step"] == 10


def test_under_slurm_a_diverged_or_unrequeued_crash_replaces_failed(tmp_path: Path, slurm: FakeSlurm,  # noqa: F811
                                                                    capsys: Any) -> None:
    diverged, crashed, requeued = tmp_path / "d", tmp_path / "c", tmp_path / "q"
    _diverged_run(diverged, skipped=[])
    (diverged / "jobs.txt").write_text("71\n")
    write_run(crashed, name="c", max_steps=30, losses=[2.0], jobs=["72"], checkpoints={10: True})
    record_event(crashed, "crashed", attempt=0, job="72", host="h", step=14, steps_lost=4, started=0.0, ended=9.0)
    record_event(crashed, "limit_reached", attempt=0, job="72", step=14, steps_lost=0)
    write_run(requeued, name="q", max_steps=30, losses=[2.0], jobs=["73"], checkpoints={10: True})
    record_event(requeued, "crashed", attempt=0, job="73", host="h", step=14, steps_lost=4, started=0.0, ended=9.0)
    for job, state in (("71", "FAILED"), ("72", "FAILED")):
        slurm.answer("sacct", job, sacct_line(job, state, 60, 0, 2))
    slurm.answer("squeue", "73", "RUNNING")
    slurm.answer("sacct", "73", sacct_line("73", "RUNNING", 60, 0, 2))
    rows = {r["name"]: r for r in json.loads(status.main([str(tmp_path), "--json"]) == 0
                                              and capsys.readouterr().out)["rows"]}
    assert rows["d"]["state"] == "diverged" and rows["d"]["step"] == 30
    assert rows["c"]["state"] == "crashed" and rows["c"]["step"] == 14
    assert rows["q"]["state"] == "RUNNING" and rows["q"]["step"] == 10
