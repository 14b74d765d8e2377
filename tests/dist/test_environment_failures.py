"""Failures from the environment end in one line (issue 22, acceptance 7), on 2 local ranks: one run directory goes
through every cause in turn, each attempt run with the same command and only the cause added, the next one run
once the cause is gone:

    checkpoint  disk full writing an asynchronous checkpoint (ENOSPC raised by the writer on its background thread)
    metrics     disk full writing metrics.jsonl
    events      disk full writing events.jsonl (the end of an attempt stopped by SIGUSR1)
    removed     the run directory moved away mid-run (restored after)
    read_only   the run directory made read-only mid-run: a read-only bind mount as root (chmod does not stop
                root's writes), chmod -R a-w otherwise (undone after)
    memory      a MemoryError on rank 1
    oom_killed  rank 1 killed by the kernel's OOM killer for real (a memory cgroup it moves into; needs root)

The disk-full cases are injected (SLURMTRAIN_TEST_DISK_FULL: the writer raises OSError(ENOSPC) at that step, see
contract/rundir/env_faults.py); the others are the real thing. Each attempt must end with exit code 74 and one `error:` line
on the launcher's stderr that names the cause, with no traceback there but one in the rank's log; every complete
checkpoint must stay intact (its manifest verifies, its state loads) and no complete step may be lost; the next
attempt must resume from the newest complete one, and the last one finishes at trainer.max_steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from contract.rundir.events import read_events
from tests.conftest import hq, launch, launcher_env, read_metrics
from contract.rundir import ckpt_layout as layout
from train.checkpoints import manifest as manifest
from contract.rundir import env_faults
from contract.rundir.environment import EXIT_ENVIRONMENT

pytestmark = pytest.mark.dist

MAX_STEPS = 24
# name, the fault's variables given the newest complete step before the attempt, what the line must say, the rank
# whose log holds the traceback (None: killed, no words). The stop for the events case comes at the first step of
# its attempt, so that no asynchronous save is in flight then.
STAGES = [
    # Every rank writes its own part of a checkpoint: the first to meet the full disk ends the attempt.
    ("checkpoint", lambda last: {env_faults.DISK_FULL_ENV: "checkpoint:6"}, ["disk full", "checkpoint step 6"],
     "any"),
    ("metrics", lambda last: {env_faults.DISK_FULL_ENV: f"metrics:{last + 5}"},
     ["disk full", "metrics (", "metrics.jsonl"], 0),
    ("events", lambda last: {env_faults.DISK_FULL_ENV: f"events:{last + 1}", "SLURMTRAIN_TEST_SIGNAL": f"{last + 1}:0"},
     ["disk full", "events (", "events.jsonl"], 0),
    # Rank 0 moves the directory away after a step; whichever rank writes there next (rank 1's part of a checkpoint
    # as often as rank 0's metrics) meets it first and names itself.
    ("removed", lambda last: {env_faults.RUN_DIR_ENV: f"remove:{last + 3}"}, ["disappeared", "restore it"], "any"),
    ("read_only", lambda last: {env_faults.RUN_DIR_ENV: f"readonly:{last + 2}"},
     ["read-only" if os.geteuid() == 0 else "permission denied"], 0),
    ("memory", lambda last: {env_faults.MEMORY_ENV: f"raise:1:{last + 2}"},
     ["host memory exhausted on rank 1", "micro_batch_size"], 1),
    ("oom_killed", lambda last: {env_faults.MEMORY_ENV: f"oom-kill:1:{last + 2}"},
     ["rank 1", "OOM killer", "micro_batch_size"], None),
]


@dataclass
class Attempt:
    result: subprocess.CompletedProcess[str]
    new_log: dict[int, str]  # what each rank's log gained
    complete_before: int | None
    complete_after: dict[int, str | None] = field(default_factory=dict)  # step -> problem (None: intact)
    status_ending: str | None = None


def _complete_checkpoints(run_dir: Path) -> dict[int, str | None]:
    out = {}
    for c in layout.list_checkpoints(run_dir):
        if c.complete:
            problem = manifest.verify(c.path, full=True)
            state = torch.load(c.path / "trainer_state.pt", weights_only=False)
            out[c.step] = problem or (None if state["step"] == c.step else f"its state says step {state['step']}")
    return out


def _newest(checkpoints: dict[int, str | None]) -> int | None:
    return max(checkpoints, default=None)


def _log_sizes(run_dir: Path) -> dict[int, int]:
    return {r: (run_dir / "logs" / f"rank_{r}.log").stat().st_size if (run_dir / "logs" / f"rank_{r}.log").exists()
            else 0 for r in range(2)}


def _undo(name: str, run_dir: Path) -> None:
    """The cause goes away, as the user would make it: the directory restored, made writable again."""
    moved = Path(f"{run_dir}{env_faults.MOVED_AWAY}")
    if name == "removed" and moved.is_dir():
        moved.rename(run_dir)
    if name == "read_only" and (os.path.ismount(run_dir) or not os.access(run_dir, os.W_OK)):
        env_faults.undo_read_only(run_dir)
    if name == "oom_killed":
        env_faults.remove_oom_cgroups()


@pytest.fixture(scope="module")
def attempts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Attempt], subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("envfail") / "runs with space's"
    root.mkdir()
    run_dir = root / "env"
    command = [f"trainer.max_steps={MAX_STEPS}", "trainer.log_every=1", "trainer.ckpt_every=3", "local.nproc=2",
               "logger.backend=none", f"run.root={hq(root)}", "run.name=env"]
    can_oom = env_faults.memory_cgroup() is not None
    done: dict[str, Attempt] = {}
    try:
        for name, fault, _, _ in STAGES:
            if name == "oom_killed" and not can_oom:
                continue
            sizes = _log_sizes(run_dir) if run_dir.exists() else {0: 0, 1: 0}
            before = _newest(_complete_checkpoints(run_dir)) if run_dir.exists() else None
            result = launch(*command, **fault(before or 0))
            _undo(name, run_dir)
            logs = {r: (run_dir / "logs" / f"rank_{r}.log").read_text(errors="replace")[sizes[r]:] for r in range(2)}
            attempt = Attempt(result, logs, before, _complete_checkpoints(run_dir))
            if name == "metrics":
                status = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"],
                                        capture_output=True, text=True, env=launcher_env(), timeout=120)
                attempt.status_ending = json.loads(status.stdout)["rows"][0]["ending"]
            done[name] = attempt
        final = launch(*command)
    finally:
        for name, *_ in STAGES:
            _undo(name, run_dir)
    return run_dir, done, final


def _stage(name: str, attempts: tuple[Path, dict[str, Attempt], subprocess.CompletedProcess[str]]) -> Attempt:
    if name not in attempts[1]:
        pytest.skip("an OOM kill needs a writable memory cgroup (root); not tried")
    return attempts[1][name]


@pytest.mark.parametrize(("name", "words", "rank"), [(n, w, r) for n, _, w, r in STAGES], ids=[s[0] for s in STAGES])
def test_an_environmental_failure_ends_in_one_line_and_keeps_what_is_complete(
        attempts: tuple[Path, dict[str, Attempt], subprocess.CompletedProcess[str]], name: str, words: list[str],
        rank: int | str | None) -> None:
    attempt = _stage(name, attempts)
    stderr = attempt.result.stderr
    assert attempt.result.returncode == EXIT_ENVIRONMENT, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and stderr.rstrip().splitlines()[-1] == errors[0], stderr[-3000:]
    for word in [*words, "run the same command"]:
        assert word in errors[0], (word, errors[0])
    assert "Traceback" not in stderr and "launcher: rank" not in stderr, stderr[-3000:]
    if rank is not None:  # the traceback is kept in the log of the rank the line names
        named = re.search(r"on rank (\d+)", errors[0])
        failed = int(named.group(1)) if named else rank
        assert (rank == "any" or failed == rank) and "Traceback" in attempt.new_log[failed], errors[0]
        assert errors[0] in attempt.new_log[failed], attempt.new_log[failed][-3000:]
    # Nothing complete is lost: every complete checkpoint is intact, the newest is no older than before.
    assert attempt.complete_after and all(p is None for p in attempt.complete_after.values()), attempt.complete_after
    assert attempt.complete_before is None or _newest(attempt.complete_after) >= attempt.complete_before


def test_each_attempt_resumes_from_the_newest_complete_checkpoint_and_the_run_finishes(
        attempts: tuple[Path, dict[str, Attempt], subprocess.CompletedProcess[str]]) -> None:
    run_dir, done, final = attempts
    following = [*(a.result for a in list(done.values())[1:]), final]
    for (name, attempt), after in zip(done.items(), following, strict=True):
        resumed = re.search(r"resumed from .*step_(\d+): step (\d+)", after.stderr)
        assert resumed is not None, (name, after.stderr[-3000:])
        assert int(resumed.group(2)) == _newest(attempt.complete_after), (name, attempt.complete_after)
    assert final.returncode == 0, final.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert sorted({r["step"] for r in rows if "loss" in r}) == list(range(1, MAX_STEPS + 1))
    assert layout.latest_complete_checkpoint(run_dir).step == MAX_STEPS


def test_the_end_is_recorded_and_shown_by_status(
        attempts: tuple[Path, dict[str, Attempt], subprocess.CompletedProcess[str]]) -> None:
    run_dir, done, _ = attempts
    metrics_line = done["metrics"].result.stderr.rstrip().splitlines()[-1]
    assert done["metrics"].status_ending == metrics_line
    events = read_events(run_dir)
    recorded = [(e["cause"], e["message"]) for e in events if e["kind"] == "environment"]
    # One event per cause, in order, where the run directory took a write: not while it was gone or read-only, nor
    # while events.jsonl itself could not be written.
    expected = [name for name in ("checkpoint", "metrics", "memory", "oom_killed") if name in done]
    printed = [done[n].result.stderr.rstrip().splitlines()[-1] for n in expected]
    assert [m for _, m in recorded] == printed, json.dumps({"recorded": recorded, "printed": printed}, indent=1)
    assert events[-1]["kind"] == "finished"
    assert len({e["attempt"] for e in events}) == len(events)  # one end per attempt
