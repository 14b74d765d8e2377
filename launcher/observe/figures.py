"""What launcher.report draws (launcher/report.py has the command): the training figure, one line figure per
metric and a sweep's final value of its ranking metric (launcher/observe/ranking.py) against each swept key, built
apart from being saved so that tests can inspect what was drawn. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.rundir.metrics_file import number_text, read_metrics, training_rows
from contract.rundir.validation_log import loss_curves
from launcher.checks.overrides import override_key
from launcher.observe.figure_marks import mark_attempts
from launcher.observe.ranking import SweepRanking, rank_runs
from launcher.observe.runs import RunRef, read_config
from launcher.sweeps.sweepdir import Point, Sweep

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


FIGSIZE_IN = (8.0, 5.0)


TRAINING_FIGSIZE_IN = (8.0, 10.0)  # loss.png: three panels


DPI = 100  # 800 x 500 pixels (loss.png 800 x 1000)


PANELS = {"loss": "loss", "lr": "learning rate", "grad_norm": "gradient norm"}  # loss.png, top to bottom


METRICS = {"tokens_per_s": "tokens/s"}  # one figure each


WIDE_SPAN = 10.0  # values further apart than this factor get a log axis


LEGEND_COLUMNS = 4


VALIDATION_STYLES = (":", "--", "-.", (0, (1, 3)), (0, (5, 2, 1, 2, 1, 2)))  # one per validation set, in order


SMOOTHING = 0.6  # the training loss's smoothed line: TensorBoard's default weight (launcher.report --smoothing)


RAW_ALPHA = 0.3  # the logged values under a smoothed line


@dataclass
class Series:
    label: str
    steps: list[int]
    values: list[float]  # nan and inf included
    color: str = "C0"  # the run's colour, the same on every panel
    style: Any = "-"  # the line style: a validation set's own (VALIDATION_STYLES)
    marker: str = ""

    def nonfinite(self) -> list[tuple[int, float]]:
        return [(step, v) for step, v in zip(self.steps, self.values, strict=True) if not math.isfinite(v)]


@dataclass
class FinalLoss:
    """One finished sweep point on a final-loss plot: its value of the plotted key, its final value of the ranking
    metric (`loss`), and the other swept values."""

    value: str
    loss: float
    group: str


def metric_series(runs: list[RunRef], key: str) -> list[Series]:
    """One series per run that logged `key` at a training step (a row of validation alone is no sample of a
    training figure); runs without metrics yet have no line (but keep their colour)."""
    out = []
    for i, run in enumerate(runs):
        rows = [r for r in training_rows(read_metrics(run.run_dir)) if _is_number(r.get(key))]
        if rows:
            out.append(Series(run.name, [r["step"] for r in rows], [float(r[key]) for r in rows], f"C{i % 10}"))
    return out


def validation_series(runs: list[RunRef]) -> tuple[list[Series], dict[str, Any]]:
    """Each run's validation loss curves, one series per set, in the run's colour and the set's dash pattern;
    and {set name: dash pattern} for the legend (the sets of all runs, in name order)."""
    curves = [loss_curves(run.run_dir) for run in runs]
    names = sorted({name for by_set in curves for name in by_set})
    styles = {name: VALIDATION_STYLES[i % len(VALIDATION_STYLES)] for i, name in enumerate(names)}
    out = []
    for i, (run, by_set) in enumerate(zip(runs, curves, strict=True)):
        for name, curve in by_set.items():
            out.append(Series(f"{run.name} val/{name}", [step for step, _ in curve], [loss for _, loss in curve],
                              f"C{i % 10}", styles[name], "o"))
    return out, styles


def draw_validation(ax: Axes, runs: list[RunRef]) -> list[Any]:
    """The validation curves on the loss panel, and one legend entry per set (a grey line in its dash pattern);
    the runs' colours are the training lines' legend entries already."""
    from matplotlib.lines import Line2D

    series, styles = validation_series(runs)
    before = len(ax.get_lines())
    draw_series(ax, series, "validation loss")
    for line, s in zip(ax.get_lines()[before:], series, strict=True):
        line.set_gid(s.label)
        if not s.nonfinite():  # a diverged curve keeps its legend entry, which names the step ("... nan from step 20")
            line.set_label(f"_{s.label}")
    return [Line2D([], [], color="grey", linestyle=style, marker="o", markersize=4, label=f"val/{name}")
            for name, style in styles.items()]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _figure(size: tuple[float, float] = FIGSIZE_IN) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # non-interactive Agg, no pyplot state: safe on login nodes without a display
    return fig


def mark_top_edge(ax: Axes, xs: list[Any], color: str, note: str, index: int) -> None:
    """An x per non-finite value on the panel's top edge at its x, the first one annotated; `index` stacks the notes
    of several series. The x range is widened to hold them (matplotlib does not autoscale to blended points)."""
    ax.scatter(xs, [1.0] * len(xs), marker="x", color=color, transform=ax.get_xaxis_transform(), clip_on=False,
               zorder=3)
    ax.update_datalim([(x, 0.0) for x in ax.xaxis.convert_units(xs)], updatey=False)
    ax.autoscale_view()
    ax.annotate(note, xy=(xs[0], 1.0), xycoords=ax.get_xaxis_transform(), xytext=(4, -12 * (index + 1)),
                textcoords="offset points", color=color, fontsize="small")


def smoothed(values: list[float], weight: float, steps: list[int] | None = None) -> list[float]:
    """TensorBoard's smoothing, by step distance: an exponential moving average in which the average before a value
    keeps `weight` per step between them (weight ** gap: a row logged every step, TensorBoard's own; sparse rows are
    far apart and keep less of it, so the line does not lag behind a falling loss), debiased so that it starts at
    the first value rather than at 0. A non-finite value is passed through and left out of the average. Without
    `steps`: one step between finite values."""
    out, average, kept, last = [], 0.0, 1.0, None
    for i, value in enumerate(values):
        if not math.isfinite(value):
            out.append(value)
            continue
        step = steps[i] if steps is not None else (last + 1 if last is not None else 0)
        w = weight ** max(1, step - last) if last is not None else weight
        average, kept, last = average * w + (1 - w) * value, kept * w, step
        out.append(average / (1 - kept))
    return out


def draw_series(ax: Axes, series: list[Series], name: str, smoothing: float = 0.0) -> None:
    """One line per series, drawn to its last finite value; its nan and inf values marked (mark_top_edge). With
    `smoothing` (0 < weight < 1): the line of the logged values faint, and their smoothed line over it in the same
    colour (gid "smoothed", no legend entry of its own)."""
    noted = 0
    for s in series:
        bad = s.nonfinite()
        note = f"{name} {number_text(bad[0][1])} from step {bad[0][0]}" if bad else ""
        finite = [v if math.isfinite(v) else math.nan for v in s.values]
        smooth = smoothing > 0 and len(s.values) > 1
        # Dots too where values are missing: a finite point between non-finite ones has no segment to draw.
        ax.plot(s.steps, finite, linestyle=s.style, marker=s.marker or ("." if bad else ""), color=s.color,
                markersize=4, label=f"{s.label} ({note})" if bad else s.label, alpha=RAW_ALPHA if smooth else None)
        if smooth:
            line = [v if math.isfinite(v) else math.nan for v in smoothed(s.values, smoothing, s.steps)]
            [drawn] = ax.plot(s.steps, line, linestyle=s.style, color=s.color, label=f"_{s.label} smoothed")
            drawn.set_gid("smoothed")
        if bad:
            mark_top_edge(ax, [step for step, _ in bad], s.color, note, noted)
            noted += 1
    ax.grid(alpha=0.3)


def legend_above(fig: Figure, handles: list[Any]) -> None:
    """The legend above the panels, never over a line or a point however many runs there are (inside a panel it
    hid the validation points it sat on): in up to LEGEND_COLUMNS columns, fewer where long labels would not fit the
    figure's width."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's, from _figure
    for columns in range(min(len(handles), LEGEND_COLUMNS), 0, -1):
        legend = fig.legend(handles=handles, loc="outside upper center", ncols=columns, fontsize="small")
        if columns == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
            return
        legend.remove()


def spans_widely(numbers: list[float]) -> bool:
    """Positive numbers further apart than WIDE_SPAN: they need a log axis."""
    return bool(numbers) and min(numbers) > 0 and max(numbers) / min(numbers) > WIDE_SPAN


def line_figure(series: list[Series], ylabel: str, title: str, runs: list[RunRef] | None = None) -> Figure:
    """`runs`: mark where their attempts stopped and resumed (figure_marks.py)."""
    fig = _figure()
    ax = fig.add_subplot()
    draw_series(ax, series, ylabel)
    if runs:
        mark_attempts(ax, runs)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    whole_steps(ax)
    legend_above(fig, ax.get_legend_handles_labels()[0])
    return fig


def whole_steps(ax: Any) -> None:
    """Steps are whole: no 2.5, 7.5 ... ticks on a short run's step axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def training_figure(runs: list[RunRef], title: str, smoothing: float = SMOOTHING) -> Figure:
    """loss.png: the loss (smoothed over its faint logged values, draw_series), the learning rate and the gradient
    norm, stacked over one step axis; the legend on top."""
    fig = _figure(TRAINING_FIGSIZE_IN)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    set_handles: list[Any] = []
    for ax, (key, label) in zip(axes, PANELS.items(), strict=True):
        series = metric_series(runs, key)
        draw_series(ax, series, label, smoothing if key == "loss" else 0.0)
        if key == "loss":
            set_handles = draw_validation(ax, runs)
        ax.set_ylabel(label)
        if not series:
            ax.text(0.5, 0.5, f"no {label} logged", ha="center", va="center", transform=ax.transAxes)
        # A learning-rate sweep: compare the runs' peak rates (one run's warm-up and decay span wide on its own).
        peaks = [max(finite) for s in series if (finite := [v for v in s.values if math.isfinite(v)])]
        if key == "lr" and spans_widely(peaks):
            ax.set_yscale("log")
    for ax in axes:
        mark_attempts(ax, runs, label=ax is axes[-1])  # where an attempt stopped and the next resumed
    axes[0].set_title(title, pad=10)  # clear of the marks on the top edge
    axes[-1].set_xlabel("step")
    whole_steps(axes[-1])
    if axes[0].get_lines():
        legend_above(fig, axes[0].get_legend_handles_labels()[0] + set_handles)
        for handle in fig.legends[0].legend_handles:  # a run's colour at full strength, as its smoothed line
            if handle is not None:
                handle.set_alpha(None)
    return fig


def swept_value(point: Point, key: str) -> str | None:
    for override in point.overrides:
        if override_key(override) == key:
            return override.split("=", 1)[1].strip("'\"") if "=" in override else None
    return None


def _numeric(values: list[str]) -> list[float] | None:
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        return None
    return numbers if all(math.isfinite(n) for n in numbers) else None


def final_losses(sweep: Sweep, runs: list[RunRef], key: str, ranked: SweepRanking | None = None) -> list[FinalLoss]:
    """Finished points only (their last logged step reached trainer.max_steps; the last step is always logged), each
    with its newest value of the ranking metric (`ranked`, default: rank_runs's)."""
    ranked = ranked or rank_runs([run.run_dir for run in runs])
    others = [k for k in map(override_key, sweep.swept) if k != key]
    out = []
    for point, run in zip(sweep.points, runs, strict=True):
        value = swept_value(point, key)
        rows = [r for r in read_metrics(run.run_dir) if _is_number(r.get("loss"))]
        max_steps = (read_config(run.run_dir).get("trainer") or {}).get("max_steps")
        if value is None or not rows or not isinstance(max_steps, int) or rows[-1]["step"] < max_steps:
            continue
        if run.run_dir not in ranked.values:
            continue
        group = " ".join(f"{k}={v}" for k in others if (v := swept_value(point, k)) is not None)
        out.append(FinalLoss(value, ranked.values[run.run_dir], group))
    return out


def mark_best(ax: Axes, points: list[FinalLoss], ranked: SweepRanking, numeric: bool) -> None:
    """A star on the best finite point by the ranking, annotated `best`."""
    best = ranked.ranking.best(dict(enumerate(p.loss for p in points)))
    if best is None:
        return
    x = float(points[best].value) if numeric else points[best].value
    ax.plot([x], [points[best].loss], marker="*", markersize=14, color="gold", markeredgecolor="black",
            linestyle="", label="_best", zorder=4)
    ax.annotate("best", xy=(x, points[best].loss), xytext=(6, 6), textcoords="offset points", fontsize="small")


def final_loss_figure(points: list[FinalLoss], key: str, title: str, ranked: SweepRanking | None = None) -> Figure:
    """x: the swept value (numeric, log when it spans more than 10x; else categorical); one line per group; a point
    whose final value is not finite is an x on the top edge at its value, labelled nan or inf. With `ranked`: the y
    axis names its metric and direction, the title says which metric ranks the points, a star marks the best."""
    from matplotlib.colors import to_hex

    fig = _figure()
    ax = fig.add_subplot()
    numbers = _numeric([p.value for p in points])
    groups = list(dict.fromkeys(p.group for p in points))
    for index, group in enumerate(groups):
        mine = [p for p in points if p.group == group and math.isfinite(p.loss)]
        if numbers is not None:
            xy = sorted((float(p.value), p.loss) for p in mine)
            [line] = ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", label=group or None)
        else:
            [line] = ax.plot([p.value for p in mine], [p.loss for p in mine], "o", label=group or None)
        for p in points:
            if p.group == group and not math.isfinite(p.loss):
                x = float(p.value) if numbers is not None else p.value
                mark_top_edge(ax, [x], to_hex(line.get_color()), number_text(p.loss), index)
    if numbers and spans_widely(numbers):
        ax.set_xscale("log")
    if not points:
        ax.text(0.5, 0.5, "no finished points yet", ha="center", va="center", transform=ax.transAxes)
    if len(groups) > 1:
        legend_above(fig, ax.get_legend_handles_labels()[0])
    ylabel = "final loss"
    if ranked is not None:
        mark_best(ax, points, ranked, numbers is not None)
        ylabel = f"final {ranked.header} ({ranked.ranking.direction})"
        title = f"{title}\n{ranked.describe()}"
    ax.set(xlabel=key, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def plot_file_name(key: str) -> str:
    return "final_loss_vs_" + re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".png"
