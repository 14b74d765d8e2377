"""What follows silent data corruption under SLURM (issue 22 follow-up), with fake scontrol and sinfo: every host the
replicas' majority names is left out of the requeued job, and a disagreement with no majority (suspects only)
rolls back in process without counting against cluster.max_failures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from contract.rundir import ckpt_layout as layout
from contract.rundir.events import is_failure, read_events, unexpected_failures
from contract.rundir.skipped_samples import SkippedSamples
from tests.unit.test_attempt_ends import fake_slurm
from train.faults import recovery
from train.faults.preemption import StopOutcome, preemption_requeues
from train.stability.corruption import respond
from train.stability.replicas import judge

CFG = OmegaConf.create({"cluster": {"max_failures": 3, "nodes": 2, "partition": None}})
NAMES = [["w"]] * 5


class _Ckpt:
    """The checkpoint manager's side of a response: one complete checkpoint, verified, at step 4."""

    def __init__(self, run_dir: Path) -> None:
        self.env, self.run_dir = SimpleNamespace(is_main=True), run_dir
        self.loads: list[int] = []

    def wait(self) -> None:
        pass

    def latest(self, where: Any = None) -> layout.CheckpointDir:
        return layout.CheckpointDir(4, layout.step_dir(self.run_dir, 4))

    def load(self, checkpoint: layout.CheckpointDir) -> dict[str, Any]:
        self.loads.append(checkpoint.step)
        return {"step": checkpoint.step}


def _respond(tmp_path: Path, prints: list[list[int]], hosts: list[str]) -> Any:
    found = judge(9, [()] * len(prints), prints, NAMES[:len(prints)])
    assert found is not None
    check = SimpleNamespace(hosts=hosts, describe=lambda f: "replicas disagree")
    return respond(found, check, _Ckpt(tmp_path), SkippedSamples(tmp_path), CFG, max_rollbacks=3, step=9)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    calls = fake_slurm(tmp_path, monkeypatch, "RUNNING")
    monkeypatch.setattr(recovery, "usable_nodes", lambda partition: ["n1", "n2", "n3", "n4", "n5"])
    monkeypatch.setattr(recovery, "exclude_when_pending", lambda run_dir, job, hosts: calls.open("a").write(
        f"exclude {job} {','.join(hosts)}\n"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    return calls


def test_every_host_outside_the_majority_is_left_out_of_the_requeued_job(tmp_path: Path, slurm: Path) -> None:
    # Ranks 1 and 4 (on n2 and n5) disagree with the three others; rank 3 shares n2 with rank 1.
    outcome = _respond(tmp_path, [[1], [2], [1], [1], [3]], ["n1", "n2", "n3", "n2", "n5"])
    assert isinstance(outcome, StopOutcome) and outcome.kind == "corruption"
    assert "scontrol requeue 7" in slurm.read_text() and "exclude 7 n2,n5" in slurm.read_text()
    [event] = read_events(tmp_path)
    assert event["kind"] == "corruption" and event["ranks"] == [1, 4] and event["host"] == "n2"
    assert unexpected_failures(tmp_path) == 1  # a requeue for it is a failure, as a crash's is


def test_a_host_is_left_out_only_while_the_partition_has_a_node_to_spare(
        tmp_path: Path, slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "usable_nodes", lambda partition: ["n1", "n2", "n3"])
    assert recovery.exclusion(CFG, "7", ["n2", "n3", "n2"]) == ["n2"]  # n3 too would leave 1 node for 2
    assert recovery.exclusion(CFG, "7", []) == []


def test_a_disagreement_with_no_majority_rolls_back_in_process_and_is_no_failure(
        tmp_path: Path, slurm: Path) -> None:
    saved = _respond(tmp_path, [[1], [2]], ["n1", "n2"])  # two replicas: both suspects, neither named
    assert saved == {"step": 4}
    assert not slurm.exists()  # no word to SLURM: no requeue, no host left out
    assert [e["kind"] for e in read_events(tmp_path)] == ["corruption", "rollback"]  # status still shows it
    assert unexpected_failures(tmp_path) == 0
    assert preemption_requeues("7", tmp_path) == 1  # the job's one restart was a preemption's


def test_only_a_corruption_that_ended_its_attempt_is_a_failure() -> None:
    assert is_failure({"kind": "corruption", "step": 9, "started": 1.0, "ended": 2.0})  # requeued (recover)
    assert not is_failure({"kind": "corruption", "step": 9, "suspects": [0, 1]})  # rolled back in process
    assert is_failure({"kind": "crashed"}) and is_failure({"kind": "hung"})
    assert not is_failure({"kind": "rollback"}) and not is_failure({"kind": "preempted"})
