"""A group started again from a checkpoint with no live group takes the newest complete checkpoint of any group
(contract/rundir/replicas.py adopt_newest), and, once another group finished the run, that group's final checkpoint
(adopt_finished): linked, not copied, complete, and only a finished group's."""

from __future__ import annotations

import os
from pathlib import Path

from contract.rundir import ckpt_layout as layout
from contract.rundir import replicas


def _checkpoint(run_dir: Path, step: int, payload: str, complete: bool = True) -> Path:
    path = layout.step_dir(run_dir, step)
    (path / "model_optim").mkdir(parents=True)
    (path / "model_optim" / "__0_0.distcp").write_text(payload)
    if complete:
        (path / layout.MARKER).write_text(f'{{"step": {step}}}\n')
    return path


def test_a_finished_groups_final_checkpoint_becomes_the_late_groups_own(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, 40, "group 0 at 40")  # group 0 (RUN_DIR itself) was lost after step 40
    _checkpoint(run, 60, "half-written", complete=False)  # and died inside a save
    done = _checkpoint(replicas.group_dir(run, 1), 100, "the run's end")
    assert replicas.adopt_finished(run, 0, 2, 100) == 1
    latest = layout.latest_complete_checkpoint(run)
    assert latest is not None and latest.step == 100
    taken = latest.path / "model_optim" / "__0_0.distcp"
    assert taken.read_text() == "the run's end"
    assert os.path.samefile(taken, done / "model_optim" / "__0_0.distcp")  # a hard link: nothing copied
    assert [c.step for c in layout.list_checkpoints(run)] == [40, 60, 100]  # nothing else touched, no partial left
    assert replicas.adopt_finished(run, 0, 2, 100) == 1 and latest.path.is_dir()  # again: the same, no error


def test_nothing_is_taken_while_no_group_has_finished(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, 40, "group 0")
    _checkpoint(replicas.group_dir(run, 1), 90, "group 1, not at the end")
    _checkpoint(replicas.group_dir(run, 2), 100, "group 2's end", complete=False)
    assert replicas.adopt_finished(run, 0, 3, 100) is None
    assert [c.step for c in layout.list_checkpoints(run)] == [40]


def test_a_group_starting_from_a_checkpoint_takes_the_newest_of_any_group(tmp_path: Path) -> None:
    """CI's lighthouse case: group 1 completed step_40 and group 0 died saving it. From its own step_20, group 0 would
    train steps 21-40 alone and meet group 1 at step 40 with other weights (torchft heals only a group behind)."""
    run = tmp_path / "run"
    _checkpoint(run, 20, "group 0 at 20")
    _checkpoint(run, 40, "group 0 half-written", complete=False)
    _checkpoint(replicas.group_dir(run, 1), 20, "group 1 at 20")
    theirs = _checkpoint(replicas.group_dir(run, 1), 40, "group 1 at 40")
    _checkpoint(replicas.group_dir(run, 2), 60, "group 2 at 60", complete=False)
    assert replicas.adopt_newest(run, 0, 3) == (1, 40)
    latest = layout.latest_complete_checkpoint(run)
    assert latest is not None and latest.step == 40
    assert os.path.samefile(latest.path / "model_optim" / "__0_0.distcp", theirs / "model_optim" / "__0_0.distcp")
    # Group 1 starting now keeps its own: no group has a newer one.
    assert replicas.adopt_newest(run, 1, 3) == (0, 40)
    assert [c.step for c in layout.list_checkpoints(replicas.group_dir(run, 1))] == [20, 40]
    # A group with no checkpoint of its own takes the newest too; none anywhere: nothing.
    assert replicas.adopt_newest(run, 2, 3) == (0, 40)
    assert replicas.adopt_newest(tmp_path / "empty", 0, 2) is None
