"""A user's plain `scancel` on the real local cluster ends the job: the ranks checkpoint when they can, nothing is
requeued, no node is left out, and events.jsonl and launcher.status say `cancelled` (not `crashed`), also when a
rank dies of the cancel before it can save (its peer then fails of the lost connection)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.rundir import ckpt_layout as layout
from contract.rundir.events import read_events
from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import hq, launch, launcher_env
from tests.slurm.helpers import logged_steps, poll, squeue_state, submitted_job_id, wait_terminal

pytestmark = pytest.mark.slurm

# Long enough never to finish on its own within the test; 2 nodes, 1 rank each.
COMMON = ["+cluster=local_slurm", "trainer.max_steps=100000", "trainer.log_every=1", "trainer.ckpt_every=0",
          "logger.backend=none"]


def _history(job_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "State"], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _excluded(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("ExcNodeList=")), "(null)")


def _status_row(run_dir: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"], capture_output=True,
                         text=True, env=launcher_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["rows"][0]


def _cancel_once_training(job_id: str, run_dir: Path, cancel: str | None = None) -> None:
    """A plain `scancel CANCEL` (the job itself by default) once `job_id` trains; returns once its ranks are gone."""
    poll(lambda: logged_steps(run_dir) >= 3, 180, "training to start")
    subprocess.run(["scancel", cancel or job_id], check=True)
    assert wait_terminal(job_id, timeout=120) == "CANCELLED"
    # The accounting says CANCELLED at once; the ranks are still stopping (COMPLETING) until they have exited.
    poll(lambda: squeue_state(job_id) not in ("RUNNING", "COMPLETING"), 120, f"job {job_id}'s ranks to exit")


@pytest.fixture
def cancel_afterwards() -> Iterator[list[str]]:
    """Jobs to cancel whatever the test found: a job requeued by mistake would otherwise wait in the queue."""
    jobs: list[str] = []
    yield jobs
    for job_id in jobs:
        subprocess.run(["scancel", job_id], capture_output=True)


def _assert_cancelled_for_good(job_id: str, run_dir: Path) -> dict:
    """One attempt, never requeued, no node left out; the last end is `cancelled`, no `crashed`; status shows it."""
    assert squeue_state(job_id) == "", squeue_state(job_id)
    assert _history(job_id) == ["CANCELLED"]
    assert _excluded(job_id) == "(null)"
    assert not list(run_dir.glob("exclude-*.log"))  # the helper that leaves a node out never ran
    events = read_events(run_dir)
    assert [e["kind"] for e in events] == ["cancelled"], events
    assert events[0]["job"] == job_id and events[0]["attempt"] == 0
    row = _status_row(run_dir)
    assert row["events"] == {"cancelled": 1} and row["state"] == "CANCELLED", row
    return events[0]


def test_scancel_of_a_running_two_node_job_checkpoints_and_ends_it(run_root: Path,
                                                                  cancel_afterwards: list[str]) -> None:
    out = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=cancel")
    assert out.returncode == 0, out.stderr[-3000:]
    job_id, run_dir = submitted_job_id(out.stdout), run_root / "cancel"
    cancel_afterwards.append(job_id)
    _cancel_once_training(job_id, run_dir)
    cancelled = _assert_cancelled_for_good(job_id, run_dir)
    # There was time: the ranks checkpointed the step they stopped at.
    latest = layout.latest_complete_checkpoint(run_dir)
    assert latest is not None and latest.step == cancelled["step"] and cancelled["steps_lost"] == 0


def test_scancel_of_an_array_task_then_of_the_array_whose_rank_dies_of_it_is_not_a_crash(
        run_root: Path, cancel_afterwards: list[str]) -> None:
    # Two 2-node points, one at a time on 3 nodes. Rank 1 dies as soon as the cancel reaches it, before it can
    # save: rank 0 loses its peer and fails. Point 0 is cancelled alone (its task), point 1 with the whole array.
    out = launch("-m", "optim.lr=1e-3,2e-3", *COMMON, f"run.root={hq(run_root)}", SLURMTRAIN_TEST_DIE_ON_TERM="1")
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"^sweep directory: (.+)$", out.stdout, re.MULTILINE)
    assert match, out.stdout
    sweep = load_sweep(Path(match.group(1)))
    array_id = sweep.arrays[0].array_id
    cancel_afterwards.append(array_id)
    tasks = [p.jobs[-1] for p in sweep.points]
    runs = [Path(p.run_dir) for p in sweep.points]
    assert tasks == [f"{array_id}_0", f"{array_id}_1"]
    _cancel_once_training(tasks[0], runs[0], tasks[0])
    _cancel_once_training(tasks[1], runs[1], array_id)
    for task, run_dir in zip(tasks, runs, strict=True):
        cancelled = _assert_cancelled_for_good(task, run_dir)
        # Rank 0 fails of the lost connection and says so, unless the cancel reached it first and its stop was
        # agreed before rank 1 died (SLURM signals the two nodes' tasks a moment apart): either way a cancel.
        assert "peer" in cancelled.get("error", "peer"), cancelled


def test_usr1_to_the_batch_shell_alone_is_passed_to_the_ranks_as_its_line_says(run_root: Path,
                                                                               cancel_afterwards: list[str]) -> None:
    """`scancel --signal=USR1 --batch` reaches the batch shell alone. Its trap said "the training ranks checkpoint
    and requeue", once the job had ended, and nothing did either; the shell now passes the signal to the ranks at
    once, and what its line says happens: they checkpoint and the job requeues itself."""
    out = launch(*COMMON, f"run.root={hq(run_root)}", "run.name=batchsig")
    assert out.returncode == 0, out.stderr[-3000:]
    job_id, run_dir = submitted_job_id(out.stdout), run_root / "batchsig"
    cancel_afterwards.append(job_id)
    poll(lambda: logged_steps(run_dir) >= 3, 180, "training to start")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True)
    poll(lambda: "REQUEUED" in _history(job_id) and read_events(run_dir), 180, f"job {job_id} to requeue itself")
    events = read_events(run_dir)
    assert events[-1]["kind"] == "preempted" and "crashed" not in [e["kind"] for e in events], events
    latest = layout.latest_complete_checkpoint(run_dir)
    assert latest is not None and latest.step == events[-1]["step"]
    logs = "".join(p.read_text() for p in (run_dir / "slurm").glob(f"{job_id}_*log.err"))
    assert "batch shell: got SIGUSR1: passed to the training ranks: they checkpoint and requeue" in logs, logs[-3000:]
    subprocess.run(["scancel", job_id], check=True)  # the requeued attempt is not needed
