"""`python -m launcher.report DIR [DIR...]`: PNG plots of a run, a sweep or a run root, written into DIR.

DIR is a run directory (config.yaml), a sweep directory (sweep.json) or a run root (a directory of run directories,
e.g. outputs/): a run root gets one figure of each kind overlaying every run below it, as `launcher.status` lists them.
`--overlay OUT` overlays the runs of every DIR given instead (loss.png and tokens_per_s.png), written into OUT.

    loss.png                   three panels over the step, one line per run in the same colour in each (a sweep's
                               points labelled by their swept values): the loss (faint as logged, under its
                               smoothed line: TensorBoard's moving average by step, --smoothing), the learning rate (on a log axis
                               when the runs' peak rates span more than 10x, as in a learning-rate sweep) and the
                               gradient norm; on the loss panel, each validation set's loss (in-loop or from
                               evaluation jobs) in the run's colour, dotted with circles, a dash pattern per set
    tokens_per_s.png           one line per run
    moe_load.png               a mixture of experts: the expert load's max/mean of each MoE layer per log interval
                               (1: even), one line per layer, named (train/observe/moe_stats.py)
    (each over the step)       where an attempt stopped (dotted) and the next resumed (dashed), from events.jsonl
    goodput.png                after a failure: one bar per run of what its GPU-time went to (trained, start-up,
                               restarts, between attempts, queue waits, redone and stalled steps, checkpointing;
                               launcher/observe/cost_figure.py) and each failure's line under the bars
    harness.png                with eval.harness.tasks: each task's scores against the step (error bars: their
                               stderr), one panel per task, each run's validation loss dotted on the right axis
                               (launcher/observe/harness_figure.py)
    final_loss_vs_<key>.png    sweeps only, one per swept key: each finished point's final value of the metric the
                               sweep is ranked by (--rank-by METRIC; default: the first validation set's loss when
                               the points have one, else the training loss averaged over the last logged interval;
                               launcher/observe/ranking.py), the axis and title saying which, a star on the best

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
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from contract.errors import EXIT_BAD_INPUT, ConfigError
from launcher.checks.overrides import override_key
from launcher.commands import CommandParser
from launcher.observe.figure_marks import moe_layer_lines
from launcher.observe.figures import (
    METRICS,
    SMOOTHING,
    Series,
    final_loss_figure,
    final_losses,
    line_figure,
    metric_series,
    plot_file_name,
    save,
    training_figure,
)
from launcher.observe.ranking import rank_runs
from launcher.observe.runs import DAMAGED, RunRef, Target, find_runs, load_config
from launcher.sweeps.sweepdir import is_sweep_dir

if TYPE_CHECKING:
    pass


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


def write_report(path: Path, target: Target, title: str, rank_by: str | None = None,
                 smoothing: float = SMOOTHING) -> list[Path]:
    written = [save(training_figure(target.runs, title, smoothing), path / "loss.png")]
    written += [save(line_figure(metric_series(target.runs, key), label, title, target.runs), path / f"{key}.png")
                for key, label in METRICS.items()]
    experts = [Series(*line) for line in moe_layer_lines(target.runs)]
    if experts:  # a mixture of experts: each MoE layer's expert load, named (1: even; top_k of E experts: E / top_k)
        written.append(save(line_figure(experts, "expert load max/mean, by layer", title, target.runs),
                            path / "moe_load.png"))
    from launcher.observe.harness_figure import harness_figure

    scores = harness_figure(target.runs, title)
    written += [save(scores, path / "harness.png")] if scores is not None else []
    from launcher.observe.cost_figure import cost_figure

    spent = cost_figure(target.runs, title)  # a run that had a failure: what its GPU-time went to, each failure
    written += [save(spent, path / "goodput.png")] if spent is not None else []
    if target.sweep is not None:
        ranked = rank_runs([run.run_dir for run in target.runs], rank_by)
        for key in dict.fromkeys(map(override_key, target.sweep.swept)):
            fig = final_loss_figure(final_losses(target.sweep, target.runs, key, ranked), key, title, ranked)
            written.append(save(fig, path / plot_file_name(key)))
    return written


def smoothing_weight(text: str) -> float:
    """--smoothing's weight; ConfigError (one line) unless 0 <= weight < 1."""
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not 0 <= weight < 1:
        raise ConfigError(f"--smoothing {text} is not a weight in [0, 1): pass --smoothing 0.6 (TensorBoard's "
                          "default; higher is smoother) or --smoothing 0 for the logged loss alone")
    return weight


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m launcher.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a run directory, a sweep directory or a run.root")
    parser.add_argument("--overlay", type=Path, metavar="OUT",
                        help="draw the runs of every DIR together (loss.png and tokens_per_s.png, one line per run) "
                             "into the directory OUT, made if missing, instead of a report in each DIR")
    parser.add_argument("--rank-by", metavar="METRIC",
                        help="a sweep's final_loss_vs_KEY.png plots this key of the points' measurements "
                        "(val/NAME/loss, harness/TASK/METRIC, loss; METRIC:max or :min when its name does not say "
                        "which way is better); default: the first validation set's loss, else the training loss "
                        "averaged over the last logged interval")
    parser.add_argument("--smoothing", metavar="WEIGHT", default=str(SMOOTHING),
                        help="loss.png's smoothed training loss over the faint logged one: TensorBoard's exponential "
                             f"moving average of this weight, 0 <= WEIGHT < 1 (default {SMOOTHING}; 0: the logged "
                             "loss alone)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from launcher.run.remote.commands import forward_or_none

    if (remote_code := forward_or_none("launcher.report", argv)) is not None:  # +remote=NAME or NAME:PATH
        return remote_code
    args = build_parser().parse_args(argv)
    from contract.search.layout import is_search_dir

    if args.overlay is None and args.dirs and all(is_search_dir(path) for path in args.dirs):
        from launcher.sweeps.search_report import main_report  # a hyperparameter search: its trials' values

        return max(main_report(path) for path in args.dirs)
    try:
        smoothing = smoothing_weight(args.smoothing)
        # Every DIR checked before anything is written.
        if args.overlay is not None:
            loaded = [(out_dir(args.overlay), *overlay(args.dirs))]
        else:
            loaded = [(path, *load(path)) for path in args.dirs]
        if args.rank_by:
            sweeps = [target for _, target, _ in loaded if target.sweep is not None]
            if not sweeps:
                raise ConfigError(f"--rank-by {args.rank_by} ranks a sweep's points (final_loss_vs_KEY.png), and no "
                                  "DIR is a sweep directory: pass one (run.root/sweeps/NAME), or drop --rank-by")
            for target in sweeps:
                rank_runs([run.run_dir for run in target.runs], args.rank_by)  # a metric no point measured: refused
        for path, target, title in loaded:
            for _, damage in damaged_runs(target):
                print(f"warning: {damage}", file=sys.stderr)
            path.mkdir(parents=True, exist_ok=True)
            for written in write_report(path, target, title, args.rank_by, smoothing):
                print(written)
    except (ConfigError, OSError) as err:
        message = err if isinstance(err, ConfigError) else f"cannot write the plots: {err}; check the directory"
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
