"""launcher.report's harness.png: lm-evaluation-harness scores against the step, one panel per task, with the
validation loss. Each run has one colour: its scores as solid lines with error bars (their stderr), a marker style per
metric, and each validation set's loss on the panel's right axis in the set's own dash pattern (as loss.png draws
them), so a score read against the loss it came with; a multiple-choice task's chance accuracy (harness/TASK/chance,
recorded by the evaluation) as a grey line. Scores come from wherever they were written (in the loop, evaluation jobs, launcher.evaluate:
contract/rundir/harness_scores.py). matplotlib is imported inside: launcher.status never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contract.rundir import harness_scores
from launcher.observe.figures import FIGSIZE_IN, _figure, legend_above, validation_series
from launcher.observe.runs import RunRef

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MARKERS = "osD^v<>"
PANEL_HEIGHT_IN = 3.5


def harness_figure(runs: list[RunRef], title: str) -> Figure | None:
    """None when no run has a harness score."""
    from matplotlib.lines import Line2D

    scores = {run.run_dir: harness_scores.curves(run.run_dir) for run in runs}
    tasks = sorted({task for by_task in scores.values() for task in by_task})
    if not tasks:
        return None
    fig = _figure((FIGSIZE_IN[0], 1.5 + PANEL_HEIGHT_IN * len(tasks)))
    axes = fig.subplots(len(tasks), 1, sharex=True, squeeze=False)[:, 0]
    colours = [f"C{k % 10}" for k in range(len(runs))]
    validation, styles = validation_series(runs)
    chance = {run.run_dir: harness_scores.chance(run.run_dir) for run in runs}
    handles: dict[str, Any] = {}
    for ax, task in zip(axes, tasks, strict=True):
        loss_ax = ax.twinx()
        level = next((levels[task] for levels in chance.values() if task in levels), None)
        if level is not None:
            ax.axhline(level, color="grey", linestyle="--", linewidth=1, gid="chance")
            handles.setdefault(f"chance ({level:.2g})", Line2D([], [], color="grey", linestyle="--"))
        for run, colour in zip(runs, colours, strict=True):
            for k, (metric, points) in enumerate(sorted(scores[run.run_dir].get(task, {}).items())):
                steps, values = [p[0] for p in points], [p[1] for p in points]
                errors = [p[2] if p[2] is not None else 0.0 for p in points]
                ax.errorbar(steps, values, yerr=errors, color=colour, marker=MARKERS[k % len(MARKERS)], capsize=3,
                            label=f"{run.name} {metric}")
                handles.setdefault(f"{run.name} {metric}", Line2D([], [], color=colour,
                                                                  marker=MARKERS[k % len(MARKERS)]))
        for series in validation:
            loss_ax.plot(series.steps, series.values, color=series.color, linestyle=series.style, alpha=0.7,
                         gid=series.label)
        for name, style in styles.items():
            handles.setdefault(f"val/{name}", Line2D([], [], color="grey", linestyle=style))
        ax.set(ylabel="score", title=task if len(runs) > 1 else f"{title}: {task}")
        loss_ax.set_ylabel("validation loss")
    axes[-1].set_xlabel("step")
    legend_above(fig, [h for label, h in handles.items() if h.set_label(label) is None])
    return fig
