"""launcher.status of a replica-group run on SLURM (a new user's trial: its state read `unknown` and its requeues 0):
the array's tasks are its groups, found by their task ids; the run's state is theirs together."""

from __future__ import annotations

from unittest import mock

from contract.rundir.accounting import Attempt
from launcher.observe import run_rows
from launcher.observe.runs import newest_tasks, with_group_tasks


def test_an_arrays_plain_id_brings_its_groups_task_ids() -> None:
    jobs = with_group_tasks(["1023", "1024"], 2)  # the lighthouse's job, then the array
    assert sorted(jobs) == ["1023", "1023_0", "1023_1", "1024", "1024_0", "1024_1"]
    assert with_group_tasks(["57_3"], 1) == ["57_3"]  # no replica groups: as recorded
    assert newest_tasks(["1023", "1023_0", "1024", "1024_0", "1024_1"]) == ["1024_0", "1024_1"]
    assert newest_tasks(["1023", "1024"]) == []


def test_the_runs_state_is_its_groups_together() -> None:
    def attempt(job: str, state: str) -> Attempt:
        return Attempt(job, state, 60, 0, 2)

    sacct = {"9_0": [attempt("9_0", "COMPLETED")], "9_1": [attempt("9_1", "REQUEUED"), attempt("9_1", "COMPLETED")]}
    with mock.patch.object(run_rows.accounting, "queue_state", return_value=""):  # both have left the queue
        assert run_rows.group_state(["9_0", "9_1"], sacct) == "COMPLETED"
        sacct["9_1"][-1] = attempt("9_1", "FAILED")
        assert run_rows.group_state(["9_0", "9_1"], sacct) == "FAILED"
    queued = {"9_0": "RUNNING", "9_1": "PENDING"}
    with mock.patch.object(run_rows.accounting, "queue_state", side_effect=lambda job: queued[job]):
        assert run_rows.group_state(["9_0", "9_1"], sacct) == "RUNNING"  # one group trains: the run runs
