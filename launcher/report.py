"""`python -m launcher.report DIR [DIR...]`: PNG plots of a run or a sweep, written into DIR.

    loss.png, tokens_per_s.png         one line per run (a sweep's points are labelled by their swept values)
    final_loss_vs_<key>.png            sweeps only, one per swept key: the final loss of each finished point

Figures are built (`*_figure`) apart from being saved (`save`) so tests can inspect what was drawn. matplotlib is
imported inside the functions: `launcher.status` and the rest of the launcher never pay for it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import EXIT_BAD_INPUT, ConfigError
from launcher.status import RunRef, Target, find_runs, read_config, read_metrics
from launcher.sweepdir import Point, Sweep, is_sweep_dir, override_key

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGSIZE_IN = (8.0, 5.0)
DPI = 100  # 800 x 500 pixels
METRICS = {"loss": "loss", "tokens_per_s": "tokens/s"}


@dataclass
class Series:
    label: str
    steps: list[int]
    values: list[float]


@dataclass
class FinalLoss:
    """One finished sweep point on a final-loss plot: its value of the plotted key, and the other swept values."""

    value: str
    loss: float
    group: str


def metric_series(runs: list[RunRef], key: str) -> list[Series]:
    """One series per run that logged `key`; runs without metrics yet have no line."""
    out = []
    for run in runs:
        rows = [r for r in read_metrics(run.run_dir) if isinstance(r.get(key), int | float)]
        if rows:
            out.append(Series(run.name, [r["step"] for r in rows], [float(r[key]) for r in rows]))
    return out


def _figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # non-interactive Agg, no pyplot state: safe on login nodes without a display
    return fig


def line_figure(series: list[Series], ylabel: str, title: str) -> Figure:
    fig = _figure()
    ax = fig.add_subplot()
    for s in series:
        ax.plot(s.steps, s.values, label=s.label)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize="small")
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
        rows = [r for r in read_metrics(run.run_dir) if isinstance(r.get("loss"), int | float)]
        max_steps = (read_config(run.run_dir).get("trainer") or {}).get("max_steps")
        if value is None or not rows or not isinstance(max_steps, int) or rows[-1]["step"] < max_steps:
            continue
        group = " ".join(f"{k}={v}" for k in others if (v := swept_value(point, k)) is not None)
        out.append(FinalLoss(value, float(rows[-1]["loss"]), group))
    return out


def final_loss_figure(points: list[FinalLoss], key: str, title: str) -> Figure:
    """x: the swept value (numeric, log when it spans more than 10x; else categorical); one line per group."""
    fig = _figure()
    ax = fig.add_subplot()
    numbers = _numeric([p.value for p in points])
    groups = list(dict.fromkeys(p.group for p in points))
    for group in groups:
        mine = [p for p in points if p.group == group]
        if numbers is not None:
            xy = sorted((float(p.value), p.loss) for p in mine)
            ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", label=group or None)
        else:
            ax.plot([p.value for p in mine], [p.loss for p in mine], "o", label=group or None)
    if numbers and min(numbers) > 0 and max(numbers) / min(numbers) > 10:
        ax.set_xscale("log")
    if not points:
        ax.text(0.5, 0.5, "no finished points yet", ha="center", va="center", transform=ax.transAxes)
    if len(groups) > 1:
        ax.legend(fontsize="small")
    ax.set(xlabel=key, ylabel="final loss", title=title)
    ax.grid(alpha=0.3)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def plot_file_name(key: str) -> str:
    return "final_loss_vs_" + re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".png"


def load(path: Path) -> tuple[Target, str]:
    """The runs to plot and the plot title; ConfigError when DIR is neither a run nor a sweep, or has no metrics."""
    if not is_sweep_dir(path) and not (path / "config.yaml").is_file():
        raise ConfigError(f"{path} is neither a run directory (config.yaml) nor a sweep directory (sweep.json): "
                          "pass one of those (for a run.root, pass each run or `python -m launcher.status` it)")
    target = find_runs(path)
    if not metric_series(target.runs, "loss"):
        raise ConfigError(f"{path} has no metrics yet (no metrics.jsonl with a logged step): wait for the first "
                          "logged step (trainer.log_every) and run the report again")
    title = target.sweep.name if target.sweep is not None else target.runs[0].name
    return target, title


def write_report(path: Path, target: Target, title: str) -> list[Path]:
    written = [save(line_figure(metric_series(target.runs, key), label, title), path / f"{key}.png")
               for key, label in METRICS.items()]
    if target.sweep is not None:
        for key in dict.fromkeys(map(override_key, target.sweep.swept)):
            fig = final_loss_figure(final_losses(target.sweep, target.runs, key), key, title)
            written.append(save(fig, path / plot_file_name(key)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a run directory or a sweep directory")
    args = parser.parse_args(argv)
    try:
        loaded = [(path, *load(path)) for path in args.dirs]  # every DIR checked before anything is written
        for path, target, title in loaded:
            for written in write_report(path, target, title):
                print(written)
    except (ConfigError, OSError) as err:
        message = err if isinstance(err, ConfigError) else f"cannot write the plots: {err}; check the directory"
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
