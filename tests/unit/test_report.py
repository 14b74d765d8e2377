"""launcher.report: the figures drawn for a fake sweep, and the PNG files written."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest

from launcher import report
from launcher.sweepdir import Point, Sweep, save_sweep
from tests.unit.test_status import write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def make_sweep(root: Path, grid: list[dict[str, str]], max_steps: int = 30,
               unfinished: tuple[int, ...] = (), no_metrics: tuple[int, ...] = ()) -> tuple[Path, list[Any]]:
    """A sweep over the keys of `grid`; returns its directory and each point's metrics rows (oldest first)."""
    rng = random.Random(len(grid))
    sweep_dir = root / "sweeps" / "my sweep"
    points, metrics = [], []
    for i, values in enumerate(grid):
        run_dir = root / f"point {i}"
        logged = 0 if i in no_metrics else (max_steps // 10 - 1 if i in unfinished else max_steps // 10)
        losses = [round(rng.uniform(1, 5), 4) for _ in range(logged)]
        metrics.append(write_run(run_dir, name=f"point {i}", max_steps=max_steps, losses=losses))
        overrides = [f"{k}={v}" for k, v in values.items()] + ["trainer.seed=1"]
        points.append(Point(i, overrides, str(run_dir), [f"90_{i}"]))
    save_sweep(sweep_dir, Sweep("my sweep", "python -m launcher -m ...", list(grid[0]), points))
    return sweep_dir, metrics


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "report dir with space's"
    path.mkdir()
    return path


LRS = ["1e-4", "3e-4", "1e-3", "3e-3"]


def test_loss_figure_has_one_line_per_point(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS])
    target, title = report.load(sweep_dir)
    fig = report.line_figure(report.metric_series(target.runs, "loss"), "loss", title)
    [ax] = fig.axes
    lines = ax.get_lines()
    assert len(lines) == len(LRS)
    for line, rows in zip(lines, metrics, strict=True):
        assert list(line.get_ydata()) == [r["loss"] for r in rows]
        assert list(line.get_xdata()) == [r["step"] for r in rows]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"optim.lr={lr}" for lr in LRS]


def test_final_loss_uses_finished_points_on_a_log_axis(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS], unfinished=(1,), no_metrics=(2,))
    target, title = report.load(sweep_dir)
    assert target.sweep is not None
    fig = report.final_loss_figure(report.final_losses(target.sweep, target.runs, "optim.lr"), "optim.lr", title)
    [ax] = fig.axes
    [line] = ax.get_lines()
    finished = sorted((float(LRS[i]), metrics[i][-1]["loss"]) for i in (0, 3))
    assert list(line.get_xdata()) == [x for x, _ in finished]
    assert list(line.get_ydata()) == [y for _, y in finished]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "optim.lr"


def test_final_loss_axis_is_linear_within_10x_and_categorical_for_strings(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"trainer.micro_batch_size": b, "strategy": s}
                                           for s in ("ddp", "fsdp") for b in ("4", "8", "16")])
    target, title = report.load(sweep_dir)
    assert target.sweep is not None
    batch = report.final_loss_figure(report.final_losses(target.sweep, target.runs, "trainer.micro_batch_size"),
                                     "trainer.micro_batch_size", title)
    [ax] = batch.axes
    assert ax.get_xscale() == "linear"
    # The other swept key tells the lines apart.
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["strategy=ddp", "strategy=fsdp"]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[4.0, 8.0, 16.0]] * 2
    strategy = report.final_loss_figure(report.final_losses(target.sweep, target.runs, "strategy"), "strategy", title)
    [ax] = strategy.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ddp", "fsdp"]
    ddp_4 = ax.get_lines()[0]
    assert ddp_4.get_label() == "trainer.micro_batch_size=4"
    assert list(ddp_4.get_ydata()) == [metrics[0][-1]["loss"], metrics[3][-1]["loss"]]


def test_main_writes_pngs_into_each_dir(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, _ = make_sweep(root, [{"optim.lr": lr} for lr in LRS])
    single = root / "single run"
    write_run(single, name="single", max_steps=20, losses=[3.0, 2.5])
    assert report.main([str(sweep_dir), str(single)]) == 0
    printed = capsys.readouterr().out.splitlines()
    expected = [sweep_dir / "loss.png", sweep_dir / "tokens_per_s.png", sweep_dir / "final_loss_vs_optim.lr.png",
                single / "loss.png", single / "tokens_per_s.png"]
    assert printed == [str(p) for p in expected]
    width, height = report.FIGSIZE_IN
    for path in expected:
        assert png_size(path) == (width * report.DPI, height * report.DPI)


@pytest.mark.parametrize("case", ["run root", "no metrics", "missing"])
def test_bad_input_is_one_line_and_exit_2(root: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(root / "fresh", name="fresh", max_steps=5)
    write_run(root / "done", name="done", max_steps=10, losses=[2.0])
    target = {"run root": root, "no metrics": root / "fresh", "missing": root / "nope"}[case]
    assert report.main([str(root / "done"), str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (root / "done" / "loss.png").exists()  # every DIR is checked before anything is written
