from __future__ import annotations

from pathlib import Path

from contract.rundir import ckpt_layout as layout


def _make(run_dir: Path, step: int, complete: bool) -> None:
    path = layout.step_dir(run_dir, step)
    path.mkdir(parents=True)
    if complete:
        layout.write_marker(path, step=step)


def test_latest_complete_ignores_incomplete_and_sorts_numerically(tmp_path: Path) -> None:
    for step, complete in [(5, True), (40, True), (100, False), (9, True)]:
        _make(tmp_path, step, complete)
    latest = layout.latest_complete_checkpoint(tmp_path)
    assert latest is not None and latest.step == 40
    assert [c.step for c in layout.incomplete_checkpoints(tmp_path)] == [100]
    assert layout.latest_complete_checkpoint(tmp_path / "nothing") is None


def test_retention_keeps_last_n_and_every_kth(tmp_path: Path) -> None:
    for step in range(10, 101, 10):
        _make(tmp_path, step, True)
    _make(tmp_path, 55, False)   # an interrupted save older than the newest complete one: garbage
    _make(tmp_path, 110, False)  # a save that may still be in flight: kept
    doomed = layout.to_delete(layout.list_checkpoints(tmp_path), keep_last=3, keep_every=50)
    assert [c.step for c in doomed] == [10, 20, 30, 40, 55, 60, 70]
    for c in doomed:
        layout.remove(c)
    assert [c.step for c in layout.list_checkpoints(tmp_path)] == [50, 80, 90, 100, 110]
