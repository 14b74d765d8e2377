"""launcher.report with sparse logging, a mixture of experts and a stopped run (issue 48, item 24): the smoothed
loss follows the loss by step distance (every 10 steps it sat well above it, 1.55 against 1.24), moe_load.png
names every MoE layer's line, and each figure over the step marks where an attempt stopped and the next resumed."""

from __future__ import annotations

import json
from pathlib import Path

from contract.rundir import metrics_file
from launcher import report
from launcher.observe import figures
from tests.unit.test_status import write_run


def test_sparse_rows_are_smoothed_by_step_distance(tmp_path: Path) -> None:
    losses = [3.0 * 0.8**i for i in range(8)]  # a loss falling fast, logged every 10 steps
    write_run(tmp_path / "a", name="a", max_steps=80, losses=losses)
    target, title = report.load(tmp_path / "a")
    _, smooth = figures.training_figure(target.runs, title).axes[0].get_lines()
    line = list(smooth.get_ydata())
    assert all(abs(s - v) <= 0.02 * v for s, v in zip(line[1:], losses[1:], strict=True)), (line, losses)
    # logged every step, TensorBoard's smoothing as before
    assert figures.smoothed([1.0, 3.0], 0.5, [1, 2]) == figures.smoothed([1.0, 3.0], 0.5)


def _with_layers_and_a_stop(run_dir: Path) -> None:
    rows = write_run(run_dir, name="moe", max_steps=60, losses=[4.0, 3.5, 3.0, 2.8, 2.6, 2.5])
    for i, row in enumerate(rows):
        row["moe_load_max_mean"] = 1.9 - 0.1 * i
        row["moe_load_max_mean_by_layer"] = {"1": 1.2, "3": 1.9 - 0.1 * i}
    (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))
    (run_dir / "events.jsonl").write_text(json.dumps({"time": 1.0, "kind": "preempted", "attempt": 0, "job": None,
                                                      "step": 30, "steps_lost": 10}) + "\n")


def test_moe_load_names_each_layer_and_figures_mark_the_stop_and_resume(tmp_path: Path) -> None:
    _with_layers_and_a_stop(tmp_path / "moe")
    target, title = report.load(tmp_path / "moe")
    written = report.write_report(tmp_path / "moe", target, title)
    assert tmp_path / "moe" / "moe_load.png" in written
    lines = [figures.Series(*line) for line in report.moe_layer_lines(target.runs)]
    assert [s.label for s in lines] == ["layer 1", "layer 3"]
    assert lines[1].values[0] == 1.9
    fig = figures.line_figure(lines, "expert load", title, target.runs)
    marks = {(line.get_gid(), float(line.get_xdata()[0])) for line in fig.axes[0].get_lines() if line.get_gid()}
    assert marks == {("stop", 30.0), ("resume", 20.0)}
    for ax in figures.training_figure(target.runs, title).axes:
        assert {line.get_gid() for line in ax.get_lines()} >= {"stop", "resume"}


def test_a_resume_at_its_stops_step_is_named_once_with_it(tmp_path: Path) -> None:
    """A stop that lost no step is resumed at the same step: one label says both (two overprinted each other)."""
    run_dir = tmp_path / "same"
    rows = write_run(run_dir, name="same", max_steps=60, losses=[4.0, 3.5, 3.0, 2.8, 2.6, 2.5])
    (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))
    (run_dir / "events.jsonl").write_text(json.dumps({"time": 1.0, "kind": "stopped", "attempt": 0, "job": None,
                                                      "step": 30, "steps_lost": 0}) + "\n")
    target, title = report.load(run_dir)
    axes = figures.training_figure(target.runs, title).axes
    for ax in axes:
        assert {line.get_gid() for line in ax.get_lines()} >= {"stop", "resume"}
    # The training figure names the marks on its last panel only.
    labels = [t.get_text() for ax in axes for t in ax.texts if (t.get_gid() or "").endswith("-label")]
    assert labels == ["stopped and resumed 30"], labels


def test_a_short_runs_step_axis_is_ticked_in_whole_steps() -> None:
    """The re-trial of issue 48: moe_load.png of a 20-step run ticked its step axis 2.5, 7.5, 12.5, 17.5."""
    line = figures.Series("layer 0", list(range(1, 21)), [1.0 + 0.01 * k for k in range(20)])
    fig = figures.line_figure([line], "expert load max/mean, by layer", "t")
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks
