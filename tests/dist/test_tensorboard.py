"""Logging on 2 ranks, as a user types it: logger.backend=tensorboard (and with wandb at once) writes event files
that TensorBoard's own EventAccumulator reads, with the loss, the learning rate and the validation loss at the
steps metrics.jsonl has; the interval mean `loss_avg` of a log_every=5 run is the mean of the steps' losses a
log_every=1 run of the same config logs, also across a resume from a checkpoint between two rows; a resumed attempt
leaves each step in TensorBoard once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import env_faults
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

STEPS = 12


def _command(run_root: Path, name: str, *keys: str) -> list[str]:
    return [f"trainer.max_steps={STEPS}", "local.nproc=2", "model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64",
            "eval.every=6", "eval.batches=1", f"run.root={hq(run_root)}", f"run.name={name}", *keys]


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _by_step(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if key in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logging") / "runs with space's"
    root.mkdir()
    with ThreadPoolExecutor(2) as pool:
        every_step = pool.submit(launch, *_command(root, "every", "trainer.log_every=1", "logger.backend=tensorboard"))
        every_5 = pool.submit(launch, *_command(root, "five", "trainer.log_every=5", "logger.backend=[wandb,tensorboard]"))
        for done in (every_step.result(), every_5.result()):
            assert done.returncode == 0, done.stderr[-3000:]
    # Each stopped by a crash, then resumed by the same command: after step 8 (checkpoint at 6), and after step 9
    # (checkpoint at 8, between the rows of steps 6 and 10).
    with ThreadPoolExecutor(2) as pool:
        for done in pool.map(_crash_and_resume, [
                _command(root, "resumed", "trainer.log_every=1", "logger.backend=tensorboard", "trainer.ckpt_every=3"),
                _command(root, "carried", "trainer.log_every=5", "logger.backend=none", "trainer.ckpt_every=4")],
                [8, 9]):
            assert done
    return root


def _crash_and_resume(command: list[str], crash_after: int) -> bool:
    crashed = launch(*command, **{env_faults.MEMORY_ENV: f"raise:1:{crash_after}"})
    assert crashed.returncode != 0 and "host memory exhausted on rank 1" in crashed.stderr, crashed.stderr[-3000:]
    resumed = launch(*command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return True


def test_tensorboard_events_hold_the_loss_lr_and_validation_of_metrics_jsonl(runs: Path) -> None:
    for name in ("every", "five"):
        rows, scalars = read_metrics(runs / name), _scalars(runs / name)
        assert {"loss", "loss_avg", "lr", "grad_norm", "val/val/loss", "val/val/ppl", "tokens_per_s"} <= set(scalars)
        for key in ("loss", "loss_avg", "lr", "val/val/loss"):
            logged = _by_step(rows, key)
            assert [s for s, _ in scalars[key]] == [s for s, _ in logged]
            assert [v for _, v in scalars[key]] == pytest.approx([v for _, v in logged], rel=1e-6)  # float32 events
        assert [s for s, _ in scalars["val/val/loss"]] == [6, 12]
    assert (runs / "five" / "wandb").is_dir() and not (runs / "every" / "wandb").exists()


def test_the_interval_mean_is_the_mean_of_the_steps_losses(runs: Path) -> None:
    every = {r["step"]: r for r in read_metrics(runs / "every")}
    five = {r["step"]: r for r in read_metrics(runs / "five")}
    # Rows at step 1, at validation steps and at the last step too; a row's interval is the steps after the row
    # before it.
    assert sorted(five) == [1, 5, 6, 10, 12]
    for step, first in ((1, 1), (5, 2), (6, 6), (10, 7), (12, 11)):
        losses = [every[k]["loss"] for k in range(first, step + 1)]
        assert five[step]["loss_avg"] == pytest.approx(sum(losses) / len(losses), rel=1e-6)
        assert five[step]["loss"] == every[step]["loss"]  # the step's own loss beside it, bitwise
    assert all(every[k]["loss_avg"] == every[k]["loss"] for k in every)  # an interval of one step


def test_a_run_resumed_between_two_rows_averages_the_whole_interval(runs: Path) -> None:
    """The checkpoint at step 8 carries steps 7 and 8 of the interval that the row at step 10 closes."""
    carried = {r["step"]: r for r in read_metrics(runs / "carried")}
    five = {r["step"]: r for r in read_metrics(runs / "five")}
    assert sorted(carried) == sorted(five) == [1, 5, 6, 10, 12]
    for step, row in five.items():
        assert carried[step]["loss"] == row["loss"]  # the same training, bitwise
        assert carried[step]["loss_avg"] == pytest.approx(row["loss_avg"], rel=1e-6)


def test_a_resumed_run_shows_each_step_once_in_tensorboard(runs: Path) -> None:
    rows, scalars = read_metrics(runs / "resumed"), _scalars(runs / "resumed")
    assert len(list((runs / "resumed" / "tensorboard").iterdir())) == 2  # one event file per attempt
    assert [s for s, _ in scalars["loss"]] == list(range(1, STEPS + 1)) == [r["step"] for r in rows]
    assert [v for _, v in scalars["loss"]] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    every = {r["step"]: r["loss"] for r in read_metrics(runs / "every")}
    assert {r["step"]: r["loss"] for r in rows} == every  # the same training, bitwise
