"""launcher.report: the figures drawn for a fake sweep, and the PNG files written."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import metrics_file
from launcher import report
from launcher.observe import figures
from launcher.sweeps.sweepdir import Point, Sweep, save_sweep
from tests.unit.test_status import DAMAGE, damage_run, write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def make_sweep(root: Path, grid: list[dict[str, str]], max_steps: int = 30,
               unfinished: tuple[int, ...] = (), no_metrics: tuple[int, ...] = (),
               diverged: dict[int, float] | None = None) -> tuple[Path, list[Any]]:
    """A sweep over the keys of `grid`; returns its directory and each point's metrics rows (oldest first). A
    point in `diverged` logs that (non-finite) loss from its second logged step on."""
    rng = random.Random(len(grid))
    sweep_dir = root / "sweeps" / "my sweep"
    points, metrics = [], []
    for i, values in enumerate(grid):
        run_dir = root / f"point {i}"
        logged = 0 if i in no_metrics else (max_steps // 10 - 1 if i in unfinished else max_steps // 10)
        losses = [round(rng.uniform(1, 5), 4) for _ in range(logged)]
        if i in (diverged or {}):
            losses[1:] = [(diverged or {})[i]] * (logged - 1)
        lr = float(values.get("optim.lr", "1e-3"))
        metrics.append(write_run(run_dir, name=f"point {i}", max_steps=max_steps, losses=losses, lr=lr))
        overrides = [f"{k}={v}" for k, v in values.items()] + ["trainer.seed=1"]
        points.append(Point(i, overrides, str(run_dir), [f"90_{i}"]))
    save_sweep(sweep_dir, Sweep("my sweep", "python -m launcher -m ...", list(grid[0]), points))
    return sweep_dir, metrics


def logged_lines(ax: Any) -> list[Any]:
    """The panel's lines of logged values: each run's smoothed loss line (gid "smoothed") left out."""
    return [line for line in ax.get_lines() if line.get_gid() != "smoothed"]


def legend_texts(fig: Any) -> list[str]:
    """The entries of the figure's legend (drawn above the panels, figures.legend_above)."""
    [legend] = fig.legends
    return [t.get_text() for t in legend.get_texts()]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "report dir with space's"
    path.mkdir()
    return path


LRS = ["1e-4", "3e-4", "1e-3", "3e-3"]


def test_loss_figure_has_one_line_per_point(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS])
    target, title = report.load(sweep_dir)
    fig = figures.line_figure(figures.metric_series(target.runs, "loss"), "loss", title)
    [ax] = fig.axes
    lines = ax.get_lines()
    assert len(lines) == len(LRS)
    for line, rows in zip(lines, metrics, strict=True):
        assert list(line.get_ydata()) == [r["loss"] for r in rows]
        assert list(line.get_xdata()) == [r["step"] for r in rows]
    assert legend_texts(fig) == [f"optim.lr={lr}" for lr in LRS]


def test_final_loss_uses_finished_points_on_a_log_axis(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS], unfinished=(1,), no_metrics=(2,))
    target, title = report.load(sweep_dir)
    assert target.sweep is not None
    fig = figures.final_loss_figure(figures.final_losses(target.sweep, target.runs, "optim.lr"), "optim.lr", title)
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
    batch = figures.final_loss_figure(figures.final_losses(target.sweep, target.runs, "trainer.micro_batch_size"),
                                     "trainer.micro_batch_size", title)
    [ax] = batch.axes
    assert ax.get_xscale() == "linear"
    # The other swept key tells the lines apart.
    assert legend_texts(batch) == ["strategy=ddp", "strategy=fsdp"]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[4.0, 8.0, 16.0]] * 2
    strategy = figures.final_loss_figure(figures.final_losses(target.sweep, target.runs, "strategy"), "strategy", title)
    [ax] = strategy.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ddp", "fsdp"]
    ddp_4 = ax.get_lines()[0]
    assert ddp_4.get_label() == "trainer.micro_batch_size=4"
    assert list(ddp_4.get_ydata()) == [metrics[0][-1]["loss"], metrics[3][-1]["loss"]]


def same_floats(got: Any, expected: list[float]) -> bool:
    got = [float(v) for v in got]
    return len(got) == len(expected) and all(
        (math.isnan(a) and not math.isfinite(b)) or a == b for a, b in zip(got, expected, strict=True))


def top_edge_marks(ax: Any) -> list[tuple[float, str]]:
    """The x marks drawn on the panel's top edge (x in data, y in axes coordinates): (step, colour) each."""
    from matplotlib import colors

    out = []
    for collection in ax.collections:
        if collection.get_offset_transform() == ax.get_xaxis_transform():
            edges = collection.get_edgecolors()  # one colour for every mark, or one each
            for i, (x, y) in enumerate(collection.get_offsets()):
                assert y == 1.0
                out.append((float(x), colors.to_hex(edges[i % len(edges)])))
    return out


@pytest.mark.parametrize(("value", "text"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_a_diverged_run_is_marked_where_its_loss_stopped_being_finite(root: Path, value: float, text: str) -> None:
    # 10 logged steps; the loss is non-finite from step 20 on: one finite point, nine that must not vanish.
    rows = write_run(root / "dead", name="dead", max_steps=100, losses=[8.3177] + [value] * 9)
    target, title = report.load(root / "dead")
    single = figures.line_figure(figures.metric_series(target.runs, "loss"), "loss", title).axes[0]
    assert [s for s, _ in top_edge_marks(single)] == list(range(20, 101, 10))
    training = figures.training_figure(target.runs, title)
    loss_ax = training.axes[0]
    [line] = logged_lines(loss_ax)
    assert list(line.get_xdata()) == [r["step"] for r in rows]
    assert same_floats(line.get_ydata(), [r["loss"] for r in rows])  # drawn to the last finite point
    from matplotlib import colors

    colour = colors.to_hex(line.get_color())
    assert top_edge_marks(loss_ax) == [(float(s), colour) for s in range(20, 101, 10)]
    assert loss_ax.get_xlim()[1] >= 100  # the steps after the divergence are on the axis
    [legend] = legend_texts(training)
    assert legend == f"dead (loss {text} from step 20)"
    assert f"loss {text} from step 20" in [t.get_text() for t in loss_ax.texts]
    # A finite run has neither marks nor notes.
    write_run(root / "fine", name="fine", max_steps=20, losses=[3.0, 2.0])
    fine = figures.training_figure(report.load(root / "fine")[0].runs, "fine").axes[0]
    assert top_edge_marks(fine) == [] and list(fine.texts) == []


def test_a_run_that_diverged_from_its_first_step_still_has_its_steps_on_the_axis(root: Path) -> None:
    write_run(root / "dead", name="dead", max_steps=30, losses=[math.nan] * 3)
    target, title = report.load(root / "dead")
    loss_ax = figures.line_figure(figures.metric_series(target.runs, "loss"), "loss", title).axes[0]
    assert [s for s, _ in top_edge_marks(loss_ax)] == [10.0, 20.0, 30.0]
    low, high = loss_ax.get_xlim()
    assert low <= 10 and high >= 30


def test_learning_rate_and_gradient_norm_panels_beside_the_loss(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS], diverged={3: math.nan})
    target, title = report.load(sweep_dir)
    fig = figures.training_figure(target.runs, title)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "learning rate", "gradient norm"]
    for ax, key in zip(fig.axes, ("loss", "lr", "grad_norm"), strict=True):
        lines = logged_lines(ax)
        assert [line.get_label() for line in lines][:3] == [f"optim.lr={lr}" for lr in LRS[:3]]
        for line, rows in zip(lines, metrics, strict=True):
            assert same_floats(line.get_ydata(), [r[key] for r in rows])
    loss_ax, lr_ax, grad_ax = fig.axes
    assert lr_ax.get_yscale() == "log"  # peak rates 1e-4 .. 3e-3 span 30x
    assert grad_ax.get_yscale() == "linear" and loss_ax.get_yscale() == "linear"
    assert [s for s, _ in top_edge_marks(loss_ax)] == [20.0, 30.0]  # point 3's nan losses
    assert lr_ax.get_shared_x_axes().joined(lr_ax, loss_ax)


def test_learning_rates_within_10x_stay_on_a_linear_axis(root: Path) -> None:
    sweep_dir, _ = make_sweep(root, [{"optim.lr": lr} for lr in ("1e-3", "3e-3")])
    target, title = report.load(sweep_dir)
    # Within one run the rate falls 10x (warm-up and decay); only the runs' peaks are compared.
    assert figures.training_figure(target.runs, title).axes[1].get_yscale() == "linear"


def test_a_run_root_is_one_figure_overlaying_its_runs(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_sweep(root, [{"optim.lr": lr} for lr in LRS], no_metrics=(2,))
    write_run(root / "solo", name="solo", max_steps=20, losses=[3.0, 2.5])
    assert report.main([str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(root / "loss.png"), str(root / "tokens_per_s.png")]
    target, title = report.load(root)
    assert title == root.name
    loss_ax = figures.training_figure(target.runs, title).axes[0]
    assert [line.get_label() for line in logged_lines(loss_ax)] == ["point 0", "point 1", "point 3", "solo"]


def test_a_diverged_sweep_point_is_on_the_final_loss_plot(root: Path) -> None:
    sweep_dir, metrics = make_sweep(root, [{"optim.lr": lr} for lr in LRS], diverged={3: math.inf})
    target, title = report.load(sweep_dir)
    assert target.sweep is not None
    ax = figures.final_loss_figure(figures.final_losses(target.sweep, target.runs, "optim.lr"), "optim.lr",
                                  title).axes[0]
    [line] = ax.get_lines()
    assert list(line.get_xdata()) == [float(lr) for lr in LRS[:3]]
    assert [s for s, _ in top_edge_marks(ax)] == [float(LRS[3])]
    assert "inf" in [t.get_text() for t in ax.texts]
    assert ax.get_xlim()[1] >= float(LRS[3])


def test_metrics_written_by_the_training_side_are_plotted(root: Path) -> None:
    run = root / "r"
    write_run(run, name="r", max_steps=20)
    rows = [{"step": 10, "loss": 4.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1.0, "tokens": 1},
            {"step": 20, "loss": math.nan, "lr": 1e-3, "grad_norm": math.inf, "tokens_per_s": 1.0, "tokens": 2}]
    (run / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))
    fig = figures.training_figure(report.load(run)[0].runs, "r")
    assert [s for s, _ in top_edge_marks(fig.axes[0])] == [20.0]
    assert [s for s, _ in top_edge_marks(fig.axes[2])] == [20.0]


def test_main_writes_pngs_into_each_dir(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, _ = make_sweep(root, [{"optim.lr": lr} for lr in LRS])
    single = root / "single run"
    write_run(single, name="single", max_steps=20, losses=[3.0, 2.5])
    assert report.main([str(sweep_dir), str(single)]) == 0
    printed = capsys.readouterr().out.splitlines()
    expected = [sweep_dir / "loss.png", sweep_dir / "tokens_per_s.png", sweep_dir / "final_loss_vs_optim.lr.png",
                single / "loss.png", single / "tokens_per_s.png"]
    assert printed == [str(p) for p in expected]
    for path in expected:
        width, height = figures.TRAINING_FIGSIZE_IN if path.name == "loss.png" else figures.FIGSIZE_IN
        assert png_size(path) == (width * figures.DPI, height * figures.DPI)


@pytest.mark.parametrize("case", ["no runs", "no metrics", "missing"])
def test_bad_input_is_one_line_and_exit_2(root: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(root / "fresh", name="fresh", max_steps=5)
    write_run(root / "done", name="done", max_steps=10, losses=[2.0])
    (root / "empty").mkdir()
    target = {"no runs": root / "empty", "no metrics": root / "fresh", "missing": root / "nope"}[case]
    assert report.main([str(root / "done"), str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (root / "done" / "loss.png").exists()  # every DIR is checked before anything is written


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_run_root_with_a_damaged_run_still_plots_every_run(root: Path, capsys: pytest.CaptureFixture[str],
                                                             damage: str) -> None:
    """One broken config.yaml does not hide the other runs: its run is drawn from its metrics, labelled, and a
    warning gives the launcher's way out; a damaged run asked for directly is refused the same way."""
    write_run(root / "good", name="good", max_steps=20, losses=[3.0, 2.5])
    damage_run(root / "d_noise", DAMAGE[damage])
    assert report.main([str(root)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [str(root / "loss.png"), str(root / "tokens_per_s.png")]
    restore = f"(cp {root / 'd_noise/checkpoints/step_20/config.yaml'} {root / 'd_noise/config.yaml'})"
    [warning] = out.err.splitlines()
    assert warning.startswith(f"warning: {root / 'd_noise/config.yaml'} is damaged (") and warning.endswith(restore)
    target, title = report.load(root)
    loss_ax = figures.training_figure(target.runs, title).axes[0]
    assert [line.get_label() for line in logged_lines(loss_ax)] == ["d_noise (damaged config)", "good"]
    assert report.main([str(root / "d_noise")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and restore in err


# ---- --overlay OUT: chosen runs in one figure of each kind

def test_overlay_draws_the_chosen_runs_together_into_out(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, sweep_rows = make_sweep(root / "sweep root", [{"optim.lr": lr} for lr in LRS[:2]])
    first = write_run(root / "a" / "d", name="d", max_steps=20, losses=[3.0, 2.5])
    second = write_run(root / "b" / "d", name="d", max_steps=20, losses=[4.0, 3.5])
    out = root / "compare" / "a and b"
    dirs = [root / "a" / "d", root / "b" / "d", sweep_dir, root / "a" / "d"]  # the same run twice: drawn once
    assert report.main([*map(str, dirs), "--overlay", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(out / "loss.png"), str(out / "tokens_per_s.png")]
    assert png_size(out / "loss.png") == (figures.TRAINING_FIGSIZE_IN[0] * figures.DPI,
                                          figures.TRAINING_FIGSIZE_IN[1] * figures.DPI)
    assert not any(p.name.endswith(".png") for d in dirs for p in d.iterdir())  # each DIR left as it was
    target, title = report.overlay(dirs)
    assert title == "d vs my sweep"
    fig = figures.training_figure(target.runs, title)
    lines = {line.get_label(): line for line in logged_lines(fig.axes[0])}
    # Runs of the same name are told apart by their directory.
    expected = {"d (a/d)": first, "d (b/d)": second, "optim.lr=1e-4": sweep_rows[0], "optim.lr=3e-4": sweep_rows[1]}
    assert list(lines) == list(expected) == legend_texts(fig)
    for label, rows in expected.items():
        assert list(lines[label].get_xdata()) == [r["step"] for r in rows]
        assert list(lines[label].get_ydata()) == [r["loss"] for r in rows]
    assert len({line.get_color() for line in lines.values()}) == len(expected)  # a colour of its own each


@pytest.mark.parametrize("case", ["out is a file", "a dir has no metrics"])
def test_overlay_bad_input_is_one_line_and_exit_2(root: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(root / "done", name="done", max_steps=10, losses=[2.0])
    write_run(root / "fresh", name="fresh", max_steps=10)
    out = root / "out"
    if case == "out is a file":
        out.write_text("keep me\n")
    dirs = [root / "done", root / ("done" if case == "out is a file" else "fresh")]
    assert report.main(["--overlay", str(out), *map(str, dirs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert (out.read_text() == "keep me\n") if case == "out is a file" else not out.exists()
    assert "--overlay" in err if case == "out is a file" else "fresh has no metrics yet" in err
