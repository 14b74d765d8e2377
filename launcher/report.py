"""`python -m launcher.report DIR [DIR...]`: PNG plots of a run, a sweep or a run root, written into DIR.

DIR is a run directory (config.yaml), a sweep directory (sweep.json) or a run root (a directory of run directories,
e.g. outputs/): a run root gets one figure of each kind overlaying every run below it, as `launcher.status` lists them.
`--overlay OUT` overlays the runs of every DIR given instead (loss.png and tokens_per_s.png), written into OUT.

    loss.png                   three panels over the step, one line per run in the same colour in each (a sweep's
                               points labelled by their swept values): the loss, the learning rate (on a log axis
                               when the runs' peak rates span more than 10x, as in a learning-rate sweep) and the
                               gradient norm; on the loss panel, each validation set's loss (in-loop or from
                               evaluation jobs) in the run's colour, dotted with circles, a dash pattern per set
    tokens_per_s.png           one line per run
    final_loss_vs_<key>.png    sweeps only, one per swept key: the final loss of each finished point

The training figures read the rows of training steps only (metrics_file.training_rows): a row of validation alone
has no loss and measured no throughput. The legend sits above the panels, never over a line or a point.

A value that is not finite (nan, inf: a run that diverged) is never left out: the line stops at the last finite
value, every non-finite step gets an x on the top edge of the panel in the run's colour, and the first one is
annotated and named in the legend ("loss nan from step 20"); a finished sweep point whose final loss is not finite
gets an x at its swept value.

Figures are built (`*_figure`) apart from being saved (`save`) so tests can inspect what was drawn. matplotlib is
imported inside the functions: `launcher.status` and the rest of the launcher never pay for it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.checks.overrides import override_key
from launcher.errors import EXIT_BAD_INPUT, ConfigError
from launcher.observe.metrics_file import number_text, read_metrics, training_rows
from launcher.observe.runs import DAMAGED, RunRef, Target, find_runs, load_config, read_config
from launcher.observe.validation_log import loss_curves
from launcher.sweeps.sweepdir import Point, Sweep, is_sweep_dir

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
    """One finished sweep point on a final-loss plot: its value of the plotted key, and the other swept values."""

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


def draw_series(ax: Axes, series: list[Series], name: str) -> None:
    """One line per series, drawn to its last finite value; its nan and inf values marked (mark_top_edge)."""
    noted = 0
    for s in series:
        bad = s.nonfinite()
        note = f"{name} {number_text(bad[0][1])} from step {bad[0][0]}" if bad else ""
        finite = [v if math.isfinite(v) else math.nan for v in s.values]
        # Dots too where values are missing: a finite point between non-finite ones has no segment to draw.
        ax.plot(s.steps, finite, linestyle=s.style, marker=s.marker or ("." if bad else ""), color=s.color,
                markersize=4, label=f"{s.label} ({note})" if bad else s.label)
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


def line_figure(series: list[Series], ylabel: str, title: str) -> Figure:
    fig = _figure()
    ax = fig.add_subplot()
    draw_series(ax, series, ylabel)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    legend_above(fig, ax.get_legend_handles_labels()[0])
    return fig


def training_figure(runs: list[RunRef], title: str) -> Figure:
    """loss.png: the loss, the learning rate and the gradient norm, stacked over one step axis; the legend on top."""
    fig = _figure(TRAINING_FIGSIZE_IN)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    set_handles: list[Any] = []
    for ax, (key, label) in zip(axes, PANELS.items(), strict=True):
        series = metric_series(runs, key)
        draw_series(ax, series, label)
        if key == "loss":
            set_handles = draw_validation(ax, runs)
        ax.set_ylabel(label)
        if not series:
            ax.text(0.5, 0.5, f"no {label} logged", ha="center", va="center", transform=ax.transAxes)
        # A learning-rate sweep: compare the runs' peak rates (one run's warm-up and decay span wide on its own).
        peaks = [max(finite) for s in series if (finite := [v for v in s.values if math.isfinite(v)])]
        if key == "lr" and spans_widely(peaks):
            ax.set_yscale("log")
    axes[0].set_title(title, pad=10)  # clear of the marks on the top edge
    axes[-1].set_xlabel("step")
    if axes[0].get_lines():
        legend_above(fig, axes[0].get_legend_handles_labels()[0] + set_handles)
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


def final_losses(sweep: Sweep, runs: list[RunRef], key: str) -> list[FinalLoss]:
    """Finished points only (their last logged step reached trainer.max_steps); the last step is always logged."""
    others = [k for k in map(override_key, sweep.swept) if k != key]
    out = []
    for point, run in zip(sweep.points, runs, strict=True):
        value = swept_value(point, key)
        rows = [r for r in read_metrics(run.run_dir) if _is_number(r.get("loss"))]
        max_steps = (read_config(run.run_dir).get("trainer") or {}).get("max_steps")
        if value is None or not rows or not isinstance(max_steps, int) or rows[-1]["step"] < max_steps:
            continue
        group = " ".join(f"{k}={v}" for k in others if (v := swept_value(point, k)) is not None)
        out.append(FinalLoss(value, float(rows[-1]["loss"]), group))
    return out


def final_loss_figure(points: list[FinalLoss], key: str, title: str) -> Figure:
    """x: the swept value (numeric, log when it spans more than 10x; else categorical); one line per group; a point
    whose final loss is not finite is an x on the top edge at its value, labelled nan or inf."""
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
    ax.set(xlabel=key, ylabel="final loss", title=title)
    ax.grid(alpha=0.3)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def plot_file_name(key: str) -> str:
    return "final_loss_vs_" + re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".png"


def damaged_runs(target: Target) -> list[tuple[RunRef, str]]:
    """The runs whose config.yaml is damaged, each with its way out (launcher.status's words)."""
    return [(run, damage) for run in target.runs if (damage := load_config(run.run_dir)[1]) is not None]


def load(path: Path) -> tuple[Target, str]:
    """The runs to plot and the plot title; ConfigError when DIR is not a run, a sweep or a run root, or has no
    metrics. A run below DIR whose config.yaml is damaged is still drawn from its metrics, labelled so."""
    target = find_runs(path)
    for run, _ in damaged_runs(target):
        run.name = f"{run.name} ({DAMAGED})"
    if not metric_series(target.runs, "loss"):
        raise ConfigError(f"{path} has no metrics yet (no metrics.jsonl with a logged step): wait for the first "
                          "logged step (trainer.log_every) and run the report again")
    if target.sweep is not None:
        title = target.sweep.name
    elif is_sweep_dir(path) or (path / "config.yaml").is_file():
        title = target.runs[0].name
    else:
        title = Path(path).resolve().name  # a run root
    return target, title


def overlay(paths: list[Path]) -> tuple[Target, str]:
    """The runs of every DIR as one target (each run once, in the order given) and its title (the DIRs' titles);
    runs of the same name are labelled with their directory, relative to what they share, to tell them apart."""
    loaded = [load(path) for path in paths]
    runs: dict[Path, RunRef] = {}
    for target, _ in loaded:
        for run in target.runs:
            runs.setdefault(run.run_dir.resolve(), run)
    names = Counter(run.name for run in runs.values())
    twins = [path for path, run in runs.items() if names[run.name] > 1]
    shared = Path(os.path.commonpath(twins)) if twins else Path()
    for path in twins:
        runs[path].name = f"{runs[path].name} ({os.path.relpath(path, shared) if path != shared else path})"
    return Target(list(runs.values())), " vs ".join(dict.fromkeys(title for _, title in loaded))


def out_dir(path: Path) -> Path:
    """--overlay's OUT: a directory, made when missing (after every DIR is checked); ConfigError when it is a file."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--overlay {path} is a file: name a directory to write the overlaid plots into "
                          "(it is made if missing)")
    return path


def write_report(path: Path, target: Target, title: str) -> list[Path]:
    written = [save(training_figure(target.runs, title), path / "loss.png")]
    written += [save(line_figure(metric_series(target.runs, key), label, title), path / f"{key}.png")
                for key, label in METRICS.items()]
    if target.sweep is not None:
        for key in dict.fromkeys(map(override_key, target.sweep.swept)):
            fig = final_loss_figure(final_losses(target.sweep, target.runs, key), key, title)
            written.append(save(fig, path / plot_file_name(key)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a run directory, a sweep directory or a run.root")
    parser.add_argument("--overlay", type=Path, metavar="OUT",
                        help="draw the runs of every DIR together (loss.png and tokens_per_s.png, one line per run) "
                             "into the directory OUT, made if missing, instead of a report in each DIR")
    args = parser.parse_args(argv)
    try:
        # Every DIR checked before anything is written.
        if args.overlay is not None:
            loaded = [(out_dir(args.overlay), *overlay(args.dirs))]
        else:
            loaded = [(path, *load(path)) for path in args.dirs]
        for path, target, title in loaded:
            for _, damage in damaged_runs(target):
                print(f"warning: {damage}", file=sys.stderr)
            path.mkdir(parents=True, exist_ok=True)
            for written in write_report(path, target, title):
                print(written)
    except (ConfigError, OSError) as err:
        message = err if isinstance(err, ConfigError) else f"cannot write the plots: {err}; check the directory"
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
