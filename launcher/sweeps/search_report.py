"""`python -m launcher.report SWEEP_DIR` of a search: search.png (every trial's reported values, pruned ones marked, and
the best so far) and importances.png (Optuna's parameter importances once two trials are complete)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from contract.search import layout
from launcher.sweeps.search_status import Summary, collect, how_trials_ended

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def search_figure(s: Summary, name: str) -> Figure:
    """Two panels: every trial's reported values by step (pruned ones dashed, an x where pruned), and the best value
    so far by trial number."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator

    fig, (ax, ax_best) = plt.subplots(1, 2, figsize=(13, 5))
    for r in s.trials:
        if not r.values:
            continue
        steps = sorted(r.values)
        (line,) = ax.plot(steps, [r.values[k] for k in steps], label=f"trial {r.number} ({r.state})",
                          linestyle="--" if r.state == "pruned" else "-")
        line.set_gid(f"trial-{r.number}")
        if r.state == "pruned":
            ax.plot([steps[-1]], [r.values[steps[-1]]], marker="x", color=line.get_color(), markersize=9)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5, 7.5 ... on a short trial
    ax.set_ylabel(s.metric)
    ax.set_title(f"{name}: {s.metric} per trial (x: pruned)")
    finite = [v for r in s.trials for v in r.values.values() if math.isfinite(v)]
    if finite and not s.higher_is_better and min(finite) > 0 and max(finite) >= 10 * min(finite):
        # A diverging trial a decade or more above the rest: a log axis, each tick labelled as a plain number (the
        # default labelled only 3x10^0 and 4x10^0, and the best trials' 2.2-2.3 could not be read).
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(1.5, 4.0, 6.0, 7.0, 8.0, 9.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
    else:  # a linear axis: its ticks (2.20, 2.25, ... or 1.06, 1.08, ...) read as they are, never as an offset
        # ("1e-6+5.5491" over ticks 80-85, when every value lay within 5e-6 of the others)
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.legend(fontsize=7, ncol=2)
    best: list[float] = []
    numbers = []
    for r in sorted(s.trials, key=lambda r: r.number):
        if r.state == "complete" and r.value is not None and math.isfinite(r.value):
            cand = r.value if not best else (max if s.higher_is_better else min)(best[-1], r.value)
        elif best:
            cand = best[-1]
        else:
            continue
        best.append(cand)
        numbers.append(r.number)
    if best:
        ax_best.step(numbers, best, where="post", marker="o")
        ax_best.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are whole: no half-trial ticks
    else:  # an empty panel read as a drawing fault; and its axes, with no data, ticked -0.04 ... 0.04 "trials"
        ax_best.text(0.5, 0.5, _why_empty(s), ha="center", va="center", wrap=True, transform=ax_best.transAxes)
        ax_best.set_xticks([])
        ax_best.set_yticks([])
    ax_best.set_xlabel("trial")
    ax_best.set_ylabel(f"best {s.metric} so far")
    ax_best.set_title("best so far")
    fig.tight_layout()
    return fig


def _why_empty(s: Summary) -> str:
    """The best-so-far panel's note while it has nothing to draw: the search goes on, or how its trials ended."""
    ended = how_trials_ended(s) if s.trials else None
    if ended is None:
        return "no trial complete yet"
    return f"no trial completed with a finite {s.metric}\n({ended}): no best"


def write_report(sweep_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = collect(sweep_dir)
    if not any(r.values for r in s.trials):
        from contract.errors import ConfigError

        raise ConfigError(f"{sweep_dir}: no trial has reported {s.metric} yet: wait for the first evaluation "
                          "(eval.every) and run the report again")
    fig = search_figure(s, Path(sweep_dir).name)
    ax = fig.axes[0]
    out = [Path(sweep_dir) / "search.png"]
    # Which trial each line is, in the PNG's own text: the file says what it draws (tests read it back).
    drawn = [str(line.get_gid()) for line in ax.get_lines() if line.get_gid()]
    fig.savefig(out[0], dpi=90, metadata={"Description": json.dumps({"lines": drawn})})
    plt.close(fig)
    importances = param_importances(sweep_dir)
    if importances:
        fig, ax = plt.subplots(figsize=(6, 1 + 0.5 * len(importances)))
        ax.barh(list(importances), list(importances.values()))
        ax.set_xlabel("importance (Optuna, PED-ANOVA)")
        ax.set_title(f"{Path(sweep_dir).name}: parameter importances")
        fig.tight_layout()
        out.append(Path(sweep_dir) / "importances.png")
        fig.savefig(out[-1], dpi=90)
        plt.close(fig)
    return out


def param_importances(sweep_dir: Path) -> dict[str, float]:
    """Optuna's importances (PED-ANOVA: no scikit-learn needed) over the complete trials; {} below two of them."""
    import warnings

    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
    from optuna.trial import TrialState

    from contract.search.optuna_objects import load_study

    study = load_study(sweep_dir, layout.load_spec(sweep_dir))
    if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < 2:
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return dict(get_param_importances(study, evaluator=PedAnovaImportanceEvaluator()))
        except (ValueError, RuntimeError):
            return {}


def main_report(sweep_dir: Path) -> int:
    from contract.errors import EXIT_BAD_INPUT, ConfigError

    try:
        for path in write_report(sweep_dir):
            print(path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
