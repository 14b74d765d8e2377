"""Validation losses in launcher.status (the newest per set, with its step; --json too) and launcher.report (each
set's curve on the loss panel, per run and sweep point), read from metrics.jsonl's in-loop rows and from
evaluation jobs' results in RUN_DIR/eval/ (contract/rundir/validation_log.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import eval_results, metrics_file, validation_log
from launcher import report, status
from launcher.observe import figures as figures_module
from tests.unit.test_report import legend_texts, make_sweep
from tests.unit.test_status import run_json, write_run


def add_validation(run_dir: Path, losses: dict[int, dict[str, float]]) -> None:
    """Put `val/NAME/loss` and `val/NAME/ppl` into metrics.jsonl as training writes them: into the row of that
    step, or a row of their own at step 0 (eval.at_start)."""
    rows = metrics_file.read_metrics(run_dir)
    for step, by_set in losses.items():
        values = {k: v for name, loss in by_set.items()
                  for k, v in ((f"val/{name}/loss", loss), (f"val/{name}/ppl", math.exp(min(loss, 700))))}
        match = [r for r in rows if r["step"] == step]
        if match:
            match[0].update(values)
        else:
            rows.insert(0, {"step": step, **values})
    (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run with space's"
    write_run(path, name="r", max_steps=40, losses=[4.0, 3.0, 2.5, 2.0])
    add_validation(path, {0: {"val": 5.5, "code": 6.0}, 20: {"val": 3.25, "code": 3.5}, 40: {"val": 2.25}})
    return path


def test_rows_from_both_sources(run_dir: Path) -> None:
    eval_results.write_result(run_dir, 30, {"val/val/loss": 2.75, "val/val/ppl": math.exp(2.75)}, job="7")
    rows = list(validation_log.validation_rows(run_dir))
    assert [step for step, _ in rows] == [0, 20, 40, 30]  # metrics.jsonl's in file order, then the jobs'
    assert rows[-1][1] == {"val/val/loss": 2.75, "val/val/ppl": math.exp(2.75)}
    assert all(key.startswith("val/") for _, values in rows for key in values)
    assert validation_log.loss_curves(run_dir) == {"code": [(0, 6.0), (20, 3.5)],
                                                   "val": [(0, 5.5), (20, 3.25), (30, 2.75), (40, 2.25)]}


def test_status_json_has_the_newest_loss_of_each_set(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [row] = run_json(capsys, str(run_dir))["rows"]
    # Each set's own newest step: "code" was last evaluated at step 20.
    assert row["validation"] == {"code": {"step": 20, "loss": 3.5}, "val": {"step": 40, "loss": 2.25}}
    assert row["loss"] == 2.0 and row["step"] == 40  # the training columns still read the training rows


def test_status_table_shows_them(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert status.main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "val loss @step" in out and "code 3.5000 @20, val 2.2500 @40" in out


def test_an_evaluation_job_newer_than_the_loop_is_shown(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    eval_results.write_result(run_dir, 60, {"val/val/loss": 1.5, "val/val/ppl": math.exp(1.5),
                                            "val/code/loss": math.inf, "val/code/ppl": math.inf}, job="9")
    [row] = run_json(capsys, str(run_dir))["rows"]
    assert row["validation"] == {"code": {"step": 60, "loss": "inf"}, "val": {"step": 60, "loss": 1.5}}


def test_the_same_step_from_both_sources_is_one_point(run_dir: Path) -> None:
    eval_results.write_result(run_dir, 20, {"val/val/loss": 3.25, "val/val/ppl": math.exp(3.25)}, job="7")
    assert [s for s, _ in validation_log.loss_curves(run_dir)["val"]] == [0, 20, 40]


def test_no_validation_no_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "plain", name="plain", max_steps=20, losses=[3.0, 2.0])
    assert status.main([str(tmp_path / "plain")]) == 0
    assert "val loss" not in capsys.readouterr().out
    [row] = run_json(capsys, str(tmp_path / "plain"))["rows"]
    assert row["validation"] == {}


def test_a_diverged_validation_is_nan_in_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_validation(run_dir, {40: {"val": math.nan}})
    [row] = run_json(capsys, str(run_dir))["rows"]
    assert row["validation"]["val"] == {"step": 40, "loss": "nan"}


# ---- launcher.report

def validation_lines(fig: Any) -> dict[str, Any]:
    loss_ax = fig.axes[0]
    return {line.get_gid(): line for line in loss_ax.get_lines() if line.get_gid() not in (None, "smoothed")}


def test_report_draws_every_set_of_every_sweep_point(tmp_path: Path) -> None:
    sweep_dir, metrics = make_sweep(tmp_path, [{"optim.lr": lr} for lr in ("1e-4", "1e-3", "1e-2")])
    target, title = report.load(sweep_dir)
    expected = {}
    for i, run in enumerate(target.runs):
        sets = {"val": 3.0 + i, "web": 4.0 + i} if i != 1 else {"val": 3.0 + i}
        add_validation(run.run_dir, {10: sets, 30: {k: v - 1 for k, v in sets.items()}})
        expected.update({f"{run.name} val/{name}": [loss, loss - 1] for name, loss in sets.items()})
    fig = figures_module.training_figure(target.runs, title)
    lines = validation_lines(fig)
    assert {gid: list(line.get_ydata()) for gid, line in lines.items()} == expected
    assert all(list(line.get_xdata()) == [10, 30] for line in lines.values())
    # A run's validation curves share its training line's colour; a set keeps one dash pattern across runs.
    train_colors = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines() if not line.get_gid()}
    for gid, line in lines.items():
        run_name, name = gid.rsplit(" val/", 1)
        assert line.get_color() == train_colors[run_name]
        assert line.get_linestyle() == lines[f"{target.runs[0].name} val/{name}"].get_linestyle()
    assert lines[f"{target.runs[0].name} val/val"].get_linestyle() != lines[f"{target.runs[0].name} val/web"].get_linestyle()
    legend = legend_texts(fig)
    assert legend == [run.name for run in target.runs] + ["val/val", "val/web"]
    assert len(metrics) == 3


def test_report_draws_evaluation_job_results_and_marks_a_diverged_set(run_dir: Path) -> None:
    eval_results.write_result(run_dir, 60, {"val/val/loss": math.nan, "val/val/ppl": math.nan}, job="9")
    target, title = report.load(run_dir)
    fig = figures_module.training_figure(target.runs, title)
    line = validation_lines(fig)["r val/val"]
    assert list(line.get_xdata()) == [0, 20, 40, 60]
    assert [v for v in line.get_ydata() if math.isfinite(v)] == [5.5, 3.25, 2.25]
    legend = legend_texts(fig)
    assert "r val/val (validation loss nan from step 60)" in legend


def test_report_writes_loss_png_with_validation(run_dir: Path) -> None:
    assert report.main([str(run_dir)]) == 0
    assert (run_dir / "loss.png").stat().st_size > 0


# ---- rows of validation alone: step 0 with eval.at_start, and the repeated pass a resume logged before it was fixed

def add_validation_only_rows(run_dir: Path, rows: dict[int, float], old: bool) -> None:
    """Rows of `val/val/loss` alone after the run's own rows of their step, as the loop writes them (`old`: with the
    `tokens_per_s` of 0 the loop wrote in them before)."""
    written = metrics_file.read_metrics(run_dir)
    for step, loss in rows.items():
        row = {"step": step, "val/val/loss": loss, "val/val/ppl": math.exp(loss), "tokens": 4096 * step // 10,
               **({"tokens_per_s": 0.0} if old else {})}
        at = max([i + 1 for i, r in enumerate(written) if r["step"] <= step], default=0)
        written.insert(at, row)
    (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in written))


@pytest.mark.parametrize("old", [True, False], ids=["with tokens_per_s 0", "without tokens_per_s"])
def test_a_validation_row_is_no_throughput_sample_nor_the_last_loss(tmp_path: Path, old: bool,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.sweeps import summary

    run_dir = tmp_path / "r"
    trained = write_run(run_dir, name="r", max_steps=40, losses=[4.0, 3.0, 2.5, 2.0])
    add_validation_only_rows(run_dir, {0: 5.5, 20: 3.25, 40: 2.25}, old)
    target, title = report.load(run_dir)
    [throughput] = figures_module.metric_series(target.runs, "tokens_per_s")
    assert throughput.steps == [10, 20, 30, 40] and throughput.values == [r["tokens_per_s"] for r in trained]
    [line] = figures_module.line_figure([throughput], "tokens/s", title).axes[0].get_lines()
    assert min(line.get_ydata()) == trained[0]["tokens_per_s"]  # no drop to 0 at step 0, 20 or 40
    for key in figures_module.PANELS:  # the training panels: one point per training step
        assert [s.steps for s in figures_module.metric_series(target.runs, key)] == [[10, 20, 30, 40]]
    assert list(validation_lines(figures_module.training_figure(target.runs, title))["r val/val"].get_xdata()) == [0, 20, 40]
    # launcher.status and a local sweep's table: the last training row's loss and throughput.
    [row] = run_json(capsys, str(run_dir))["rows"]
    assert (row["step"], row["loss"], row["tokens_per_s"]) == (40, 2.0, trained[-1]["tokens_per_s"])
    assert summary.last_row(run_dir)["loss"] == 2.0


def test_a_diverged_run_ending_in_a_validation_row_is_still_diverged(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "dead"
    write_run(run_dir, name="dead", max_steps=40, losses=[4.0, math.nan, math.nan])
    add_validation_only_rows(run_dir, {30: math.nan}, old=True)
    [row] = run_json(capsys, str(run_dir))["rows"]
    assert row["loss"] == "nan" and row["loss_nonfinite_since"] == 20


def test_only_a_step_0_validation_row_shows_no_loss_and_no_throughput(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "starting"
    write_run(run_dir, name="starting", max_steps=40)
    add_validation_only_rows(run_dir, {0: 5.5}, old=True)
    [row] = run_json(capsys, str(run_dir))["rows"]
    assert (row["step"], row["loss"], row["tokens_per_s"]) == (0, None, None)


def _overlaps(fig: Any) -> list[str]:
    """What a legend of the drawn figure covers: a panel (its lines and points) or a title; and whether one leaves
    the figure."""
    fig.canvas.draw()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert legends
    covered = []
    for legend in legends:
        box = legend.get_window_extent()
        covered += [f"panel {i}" for i, ax in enumerate(fig.axes) if box.overlaps(ax.get_window_extent())]
        covered += [f"title {i}" for i, ax in enumerate(fig.axes) if ax.get_title()
                    and box.overlaps(ax.title.get_window_extent())]
        if not fig.bbox.contains(box.x0, box.y0) or not fig.bbox.contains(box.x1, box.y1):
            covered.append("outside the figure")
    return covered


def test_the_legend_covers_no_line_point_or_title_however_many_runs(tmp_path: Path) -> None:
    sweep_dir, _ = make_sweep(tmp_path, [{"optim.lr": f"{i}e-3", "optim.weight_decay": wd} for i in range(1, 5)
                                         for wd in ("0.0", "0.1")])
    target, title = report.load(sweep_dir)
    assert target.sweep is not None and len(target.runs) == 8
    for i, run in enumerate(target.runs):
        add_validation(run.run_dir, {0: {"val": 5.0, "web": 5.5}, 10: {"val": 3.0 + i / 8, "web": 4.0},
                                     30: {"val": 2.0 + i / 8, "web": 3.0}})
    figures = {"loss.png": figures_module.training_figure(target.runs, title),
               "tokens_per_s.png": figures_module.line_figure(figures_module.metric_series(target.runs, "tokens_per_s"), "tokens/s",
                                                      title),
               "final loss": figures_module.final_loss_figure(figures_module.final_losses(target.sweep, target.runs, "optim.lr"),
                                                      "optim.lr", title)}
    assert {name: _overlaps(fig) for name, fig in figures.items()} == {name: [] for name in figures}
    assert legend_texts(figures["loss.png"]) == [run.name for run in target.runs] + ["val/val", "val/web"]
