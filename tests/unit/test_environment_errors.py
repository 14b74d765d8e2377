"""contract/rundir/environment.py: failures from outside the code are told apart by type and errno (through causes,
contexts and a checkpoint collective's per-rank failures) and told in one line that says what, where and what to
do; anything else is left alone. events.jsonl appends survive a line cut short by a full disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from contract.rundir import ckpt_layout as layout
from contract.rundir import environment as environment
from contract.rundir.events import EVENTS_FILE, read_events, record_environment_end, record_event


def _oserror(code: int, path: Path | None = None) -> OSError:
    return OSError(code, os.strerror(code), None if path is None else str(path))


def _one_line(ending: environment.Ending | None) -> str:
    assert ending is not None
    assert "\n" not in ending.line and ending.line.startswith("error: ")
    return ending.line


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints" / "step_4").mkdir(parents=True)
    layout.write_marker(run / "checkpoints" / "step_4", step=4, world_size=2)
    (run / "checkpoints" / "step_6").mkdir()  # interrupted: no marker
    return run


@pytest.mark.parametrize(("code", "cause", "words"), [
    (errno.ENOSPC, environment.DISK_FULL, ["disk full", "free space", "df -h"]),
    (errno.EDQUOT, environment.QUOTA, ["quota exceeded", "quota -s"]),
    (errno.EROFS, environment.READ_ONLY, ["read-only", "remount it writable"]),
    (errno.EACCES, environment.NOT_WRITABLE, ["permission denied", "writable for you again"]),
])
def test_a_write_that_fails_for_the_environment_names_file_fix_and_resume_step(
        run_dir: Path, code: int, cause: str, words: list[str]) -> None:
    metrics = run_dir / "metrics.jsonl"
    ending = environment.classify(_oserror(code, metrics), run_dir, rank=0, host="n1", step=7)
    line = _one_line(ending)
    assert ending is not None and ending.cause == cause
    for word in [*words, f"metrics ({metrics})", "rank 0 (n1)", "run the same command", "(step 4)"]:
        assert word in line, (word, line)


def test_a_checkpoint_collective_says_which_rank_and_step_failed(run_dir: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    try:
        raise _oserror(errno.ENOSPC)  # DCP's writer: a write() has no file name
    except OSError as err:
        wrapped = _wrap_exception(err)
    collective = CheckpointException("save failed", {1: wrapped})
    outer = RuntimeError("async save failed")
    outer.__cause__ = collective
    line = _one_line(environment.classify(outer, run_dir, rank=0, host="n1", step=8))
    assert "disk full" in line and "on rank 1" in line and "a checkpoint" in line, line
    shard = run_dir / "checkpoints" / "step_8" / "model_optim" / "__0_0.distcp"
    line = _one_line(environment.classify(_oserror(errno.ENOSPC, shard), run_dir, rank=0))
    assert f"checkpoint step 8 ({shard})" in line, line


def test_a_cause_deep_in_the_chain_is_found(run_dir: Path) -> None:
    try:
        try:
            raise _oserror(errno.ENOSPC, run_dir / "events.jsonl")
        except OSError as inner:
            raise ValueError("while recording") from inner
    except ValueError as err:
        line = _one_line(environment.classify(err, run_dir))
    assert "events (" in line


def test_a_missing_file_is_the_environment_only_when_the_run_directory_went_away(run_dir: Path) -> None:
    missing = _oserror(errno.ENOENT, run_dir / "metrics.jsonl")
    assert environment.classify(missing, run_dir) is None  # the directory is there: a bug, not the environment
    moved = run_dir.with_name("elsewhere")
    run_dir.rename(moved)
    ending = environment.classify(missing, run_dir, rank=0, host="n1")
    line = _one_line(ending)
    assert ending is not None and ending.cause == environment.RUN_DIR_GONE
    assert f"the run directory {run_dir} disappeared" in line and "restore it" in line


@pytest.mark.parametrize("err", [
    MemoryError(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"),
])
def test_host_memory_exhausted_says_reduce_the_micro_batch(run_dir: Path, err: BaseException) -> None:
    ending = environment.classify(err, run_dir, rank=1, host="n2", step=17)
    line = _one_line(ending)
    assert ending is not None and ending.cause == environment.HOST_MEMORY
    for word in ["host memory exhausted on rank 1 (n2) at step 17", "trainer.micro_batch_size",
                 "cluster.mem_per_task_gb", "(step 4)"]:
        assert word in line, (word, line)


@pytest.mark.parametrize("err", [
    RuntimeError("Connection closed by peer"), ValueError("bad batch"), KeyError("x"),
    _oserror(errno.EIO), _oserror(errno.ECONNRESET),
])
def test_other_failures_are_not_the_environment(run_dir: Path, err: BaseException) -> None:
    assert environment.classify(err, run_dir) is None


def test_the_run_directory_is_checked_by_trying_it(run_dir: Path, tmp_path: Path) -> None:
    assert environment.run_dir_problem(run_dir) is None
    assert not list(run_dir.glob(".write-check-*"))  # the probe leaves nothing behind
    gone = environment.run_dir_problem(tmp_path / "nowhere", "(rank 0 on n1)")
    assert gone is not None and gone.cause == environment.RUN_DIR_GONE and "(rank 0 on n1)" in gone.line


def test_an_oom_kill_is_read_from_the_kernel_log(monkeypatch: pytest.MonkeyPatch) -> None:
    log = ("[ 11603.98] Memory cgroup out of memory: Killed process 30384 (python) total-vm:82516kB\n"
           "[ 11604.00] Killed process 4242 (python)\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, log, ""))
    assert environment.oom_killed(30384) and environment.oom_killed(4242)
    assert not environment.oom_killed(3038) and not environment.oom_killed(303845)
    line = environment.oom_killed_line(1, "n2", 19, Path("/nonexistent"))
    assert "rank 1 (n2) was killed by the kernel's OOM killer at step 19" in line and "\n" not in line


def test_an_event_after_a_line_cut_short_is_kept_and_earlier_rows_are_intact(tmp_path: Path) -> None:
    record_event(tmp_path, "stopped", attempt=0, step=3)
    with open(tmp_path / EVENTS_FILE, "a") as f:
        f.write('{"time": 1, "kind": "fini')  # a full disk cut this append short
    record_event(tmp_path, "finished", attempt=1, step=9)
    assert [(e["kind"], e["attempt"]) for e in read_events(tmp_path)] == [("stopped", 0), ("finished", 1)]


def test_the_launchers_environment_end_takes_the_place_of_the_same_attempts_crash(tmp_path: Path) -> None:
    record_event(tmp_path, "stopped", attempt=0, job=None, step=3)
    record_event(tmp_path, "crashed", attempt=1, job=None, step=5)  # rank 0 lost its OOM-killed peer
    record_environment_end(tmp_path, 1, cause=environment.OOM_KILLED, message="error: killed", step=5)
    record_environment_end(tmp_path, 1, cause=environment.OOM_KILLED, message="error: killed", step=5)  # once
    events = read_events(tmp_path)
    assert [(e["kind"], e["attempt"]) for e in events] == [("stopped", 0), ("environment", 1)]
    assert events[1]["message"] == "error: killed"
    record_environment_end(tmp_path, 2, cause=environment.DISK_FULL, message="error: full", step=7)
    assert json.loads((tmp_path / EVENTS_FILE).read_text().splitlines()[-1])["attempt"] == 2


def test_status_tells_a_slurm_out_of_memory_end_in_one_line(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.observe import run_rows
    from launcher.observe.runs import RunRef

    monkeypatch.setattr(run_rows, "slurm_state", lambda job, attempts: "OUT_OF_MEMORY")
    row = run_rows.run_row(RunRef("run", run_dir, ["4242"]), None)
    assert row.state == "OUT_OF_MEMORY" and row.ending is not None
    assert row.ending.startswith("error: job 4242 ran out of host memory") and "trainer.micro_batch_size" in row.ending
    assert "\n" not in row.ending and "(step 4)" in row.ending


def test_the_way_back_says_the_run_starts_over_when_nothing_was_checkpointed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert environment.resume_hint(run).endswith("no checkpoint was complete yet, so it starts from step 0")
    (run / "checkpoints" / "step_5").mkdir(parents=True)  # incomplete: no marker
    assert "starts from step 0" in environment.resume_hint(run)
    layout.write_marker(run / "checkpoints" / "step_5")
    assert environment.resume_hint(run).endswith("(step 5)")
    assert "newest complete checkpoint" in environment.resume_hint(tmp_path / "vanished")
