"""launcher.report's loss panel: each run's logged training loss faint, under its smoothed line (TensorBoard's
debiased exponential moving average, --smoothing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from launcher import report
from launcher.observe import figures
from tests.unit.test_status import write_run


def test_smoothing_is_tensorboards_debiased_moving_average() -> None:
    # By hand, weight 0.5: 0.5 x 1 / (1 - 0.5) = 1; (0.5 x 0.5 + 0.5 x 3) / (1 - 0.25) = 2.333...
    assert figures.smoothed([1.0, 3.0], 0.5) == pytest.approx([1.0, 7 / 3])
    assert figures.smoothed([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # debiased: no pull towards 0 at the start
    # A non-finite value is shown as it is and left out of the average.
    out = figures.smoothed([1.0, math.nan, 3.0, math.inf], 0.5)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(7 / 3) and out[3] == math.inf
    assert figures.smoothed([1.0, 3.0], 0.0) == [1.0, 3.0]


def test_the_loss_panel_draws_the_smoothed_loss_over_the_faint_logged_one(tmp_path: Path) -> None:
    losses = [5.0, 3.0, 4.0, 2.0, 2.5, 1.0]
    rows = write_run(tmp_path / "a", name="a", max_steps=60, losses=losses)
    target, title = report.load(tmp_path / "a")
    fig = figures.training_figure(target.runs, title)
    loss_ax, lr_ax, grad_ax = fig.axes
    raw, smooth = loss_ax.get_lines()
    assert list(raw.get_ydata()) == losses and raw.get_alpha() == figures.RAW_ALPHA and raw.get_label() == "a"
    assert smooth.get_gid() == "smoothed" and smooth.get_alpha() is None and smooth.get_color() == raw.get_color()
    assert list(smooth.get_xdata()) == [r["step"] for r in rows]
    assert list(smooth.get_ydata()) == pytest.approx(figures.smoothed(losses, figures.SMOOTHING, [r["step"] for r in rows]))
    assert max(smooth.get_ydata()) - min(smooth.get_ydata()) < max(losses) - min(losses)  # smoother
    # The legend names the run once, at full strength; the other panels are drawn as logged.
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a"] and legend.legend_handles[0].get_alpha() is None
    assert all(len(ax.get_lines()) == 1 and ax.get_lines()[0].get_alpha() is None for ax in (lr_ax, grad_ax))


def test_smoothing_0_draws_the_logged_loss_alone(tmp_path: Path) -> None:
    write_run(tmp_path / "a", name="a", max_steps=30, losses=[3.0, 2.0, 2.5])
    target, title = report.load(tmp_path / "a")
    [line] = figures.training_figure(target.runs, title, smoothing=0.0).axes[0].get_lines()
    assert line.get_alpha() is None and list(line.get_ydata()) == [3.0, 2.0, 2.5]


def test_a_diverged_runs_smoothed_line_stops_where_its_loss_does(tmp_path: Path) -> None:
    write_run(tmp_path / "dead", name="dead", max_steps=40, losses=[4.0, 3.0, math.nan, math.nan])
    target, title = report.load(tmp_path / "dead")
    _, smooth = figures.training_figure(target.runs, title).axes[0].get_lines()
    values = list(smooth.get_ydata())
    assert values[:2] == pytest.approx(figures.smoothed([4.0, 3.0], figures.SMOOTHING, [10, 20]))
    assert all(math.isnan(v) for v in values[2:])


def test_main_takes_smoothing_and_refuses_a_weight_outside_0_to_1(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "a", name="a", max_steps=30, losses=[3.0, 2.0, 2.5])
    assert report.main([str(tmp_path / "a"), "--smoothing", "0.9"]) == 0
    assert (tmp_path / "a" / "loss.png").is_file()
    (tmp_path / "a" / "loss.png").unlink()
    for bad in ("1", "-0.1", "nan", "smooth"):
        capsys.readouterr()
        assert report.main([str(tmp_path / "a"), "--smoothing", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --smoothing {bad} is not a weight in [0, 1)") and err.count("\n") == 1
        assert not (tmp_path / "a" / "loss.png").exists()
