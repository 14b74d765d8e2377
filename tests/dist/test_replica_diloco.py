"""optim.outer=diloco across local replica groups (torchft 0.2.0 over gloo; train/replicas/diloco.py, docs/faults.md):
the groups communicate every optim.sync_every steps only, train the tiny model about as well as the per-step average
across groups, end with equal weights, and a stop of every group resumes bit for bit (the global weights and the
outer momentum are in the checkpoint)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.conftest import hq, launch, read_metrics
from tests.dist.test_replica_groups import (
    COMMON,
    FAST,
    PATIENT,
    _logged_steps,
    group_dir,
    stop_and_resume,
    weights,
)

pytest.importorskip("torchft")
pytestmark = [pytest.mark.dist, pytest.mark.xdist_group("replica_groups")]

# Two groups of one rank each. The outer momentum is 0.5, not the paper's 0.9: with 20 syncs in 200 steps 0.9 overshoots
# on the tiny model (measured: 22% above the per-step average's loss at step 200; 0.5: 1%; docs/faults.md).
GROUPS = [*COMMON, *PATIENT, "strategy=ddp", "local.nproc=2", "parallel.replica_groups=2", "trainer.ckpt_every=0"]
DILOCO = ["optim.outer=diloco", "optim.sync_every=10", "optim.outer_lr=0.7", "optim.outer_momentum=0.5"]


def _allreduces(run_dir: Path, group: int) -> int:
    text = (group_dir(run_dir, group) / "logs" / "rank_0.log").read_text()
    return int(re.findall(r"cross-group all-reduces: (\d+)", text)[-1])


def _final_loss(run_dir: Path) -> float:
    """Group 0's mean loss over the last 10 steps (each logged: trainer.log_every=1): less noisy than one step's."""
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r][-10:]
    return sum(losses) / len(losses)


def test_diloco_all_reduces_a_tenth_as_often_and_trains_as_well(run_root: Path, tmp_path: Path) -> None:
    steps = 200
    runs = {"ddp": [], "diloco": DILOCO}
    for name, extra in runs.items():
        out = launch(*GROUPS, *extra, f"trainer.max_steps={steps}", f"run.root={hq(run_root)}", f"run.name={name}")
        assert out.returncode == 0, out.stderr[-3000:]
    counts = {name: [_allreduces(run_root / name, g) for g in range(2)] for name in runs}
    assert counts["ddp"] == [steps, steps], counts  # one float32 buffer a step
    assert counts["diloco"][0] * 10 == counts["ddp"][0] and counts["diloco"][0] == counts["diloco"][1], counts
    losses = {name: _final_loss(run_root / name) for name in runs}
    assert abs(losses["diloco"] - losses["ddp"]) <= 0.05 * losses["ddp"], losses
    # The last step is a sync: every group ends with the same weights, bit for bit.
    final = [weights(group_dir(run_root / "diloco", g) / "checkpoints" / f"step_{steps}", tmp_path) for g in range(2)]
    assert final[0].keys() and all(torch.equal(final[1][k], v) for k, v in final[0].items())
    print(f"cross-group all-reduces per group: {counts}; mean loss of steps 191-200: {losses}")


def test_a_diloco_stop_checkpoints_at_a_sync_and_resumes_exactly(run_root: Path, tmp_path: Path) -> None:
    steps = 40
    args = [*GROUPS, *DILOCO, "optim.sync_every=5", f"trainer.max_steps={steps}", f"run.root={hq(run_root)}"]
    saved = stop_and_resume(args, steps, 6, run_root, tmp_path)
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(saved / "model_optim")).read_metadata()
    outer = {k.split(".")[1] for k in keys.state_dict_metadata if k.startswith("diloco.")}
    assert outer == {"global", "momentum", "syncs"}, outer  # the outer state is in the DCP checkpoint
    stop_step = int(saved.name.split("_")[1])
    assert stop_step % 5 == 0 and 5 < stop_step < steps, stop_step  # the groups agree at a sync, the next after it


def test_a_stop_that_reaches_one_diloco_group_is_taken_alone_at_a_sync(run_root: Path, tmp_path: Path) -> None:
    """SIGTERM to group 1 only, at step 5, under DiLoCo (H=5): the ask travels with the syncs; after its wait the
    group checkpoints and leaves at a sync, group 0 trains every step on, and group 1, started again, heals at a
    later sync; both end with the same weights."""
    import json

    from train.replicas.stops import ALONE_WAIT_S

    steps, every = 150, 5
    out = launch(*COMMON, *FAST, "strategy=ddp", "local.nproc=2", "parallel.replica_groups=2", "trainer.ckpt_every=0",
                 "optim.outer=diloco", f"optim.sync_every={every}", f"trainer.max_steps={steps}",
                 f"run.root={hq(run_root)}", "run.name=alone", SLURMTRAIN_TEST_SIGNAL="5:0:group=1:signal=TERM",
                 SLURMTRAIN_TEST_SLOW_RANK="0:0.1")
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = run_root / "alone"
    text = (group_dir(run_dir, 1) / "logs" / "rank_0.log").read_text()
    assert "replica group 1 asked to stop (SIGTERM) at step 5; the other groups hear it with the next sync" in text
    found = re.search(r"replica group 1 stops alone at step (\d+) \(SIGTERM reached only it: the others did not ask "
                      r"within ([\d.]+) s\); groups \[0\] go on", text)
    assert found, text[-3000:]
    left, waited = int(found.group(1)), float(found.group(2))
    assert left % every == 0 and 5 < left < steps and waited >= ALONE_WAIT_S, (left, waited)  # at a sync
    assert (group_dir(run_dir, 1) / "checkpoints" / f"step_{left}" / "COMPLETE").is_file()
    assert _logged_steps(run_dir, steps) == set(range(1, steps + 1))  # group 0 trained every step
    healed = re.findall(r"healed from a live group at step (\d+)", text)
    assert healed and int(healed[-1]) + 1 > left and (int(healed[-1]) + 1) % every == 0, healed  # at a later sync
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["group"], e["step"], e["requeue"], e["groups_on"]) for e in events if e["kind"] == "replica_left"] == [
        (1, left, False, [0])], events
    rejoined = [e for e in events if e["kind"] == "replica_rejoined"]
    assert len(rejoined) == 1 and rejoined[0]["lost_step"] == left + 1, events
    final = [weights(group_dir(run_dir, g) / "checkpoints" / f"step_{steps}", tmp_path) for g in range(2)]
    assert all(torch.equal(final[1][name], value) for name, value in final[0].items())
