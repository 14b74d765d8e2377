"""What a search has done, read from its study: `python -m launcher.status SWEEP_DIR` (a table of the trials and a
summary) and `python -m launcher.report SWEEP_DIR` (search.png: every trial's reported values, pruned ones marked, and
the best so far; importances.png: Optuna's parameter importances once two trials are complete)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract.search import layout

STATES = {"RUNNING": "running", "COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "WAITING": "waiting"}


@dataclass
class TrialRow:
    number: int
    params: dict[str, Any]
    state: str
    value: float | None  # the last reported value (a complete trial's final one)
    steps: int
    max_steps: int
    seconds: float
    ranks: int
    run_dir: str
    reason: str = ""
    values: dict[int, float] = field(default_factory=dict)
    step_s: float | None = None  # a trained step's wall time once running (search_worker.steady_step_seconds)

    def gpu_hours_to_end(self) -> float:
        """GPU-hours had this trial run to its last step: what it used, plus its steps left at its steady pace (its
        time per step so far, start-up included, when it has no pace yet)."""
        left = max(self.max_steps - self.steps, 0)
        if self.step_s is not None:
            return (self.seconds + left * self.step_s) * self.ranks / 3600
        return self.seconds * self.ranks * (self.max_steps / self.steps if self.steps else 1.0) / 3600


@dataclass
class Summary:
    trials: list[TrialRow]
    best: TrialRow | None
    metric: str
    higher_is_better: bool
    n_trials: int
    gpu_hours: float  # used (ranks x training hours)
    gpu_hours_to_end: float  # had every trial so far run to its last step
    steps: int
    steps_to_end: int


def collect(sweep_dir: Path) -> Summary:
    from contract.search.optuna_objects import load_study

    spec = layout.load_spec(sweep_dir)
    study = load_study(sweep_dir, spec)
    rows = []
    for t in study.get_trials(deepcopy=False):
        values = dict(t.intermediate_values)
        last = values[max(values)] if values else None
        ua = t.user_attrs
        steps = int(ua.get("steps", max(values) if values else 0))
        rows.append(TrialRow(number=t.number, params=dict(t.params), state=STATES.get(t.state.name, t.state.name),
                             value=t.value if t.value is not None else last, steps=steps,
                             max_steps=int(ua.get("max_steps", spec.max_steps)), seconds=float(ua.get("seconds", 0)),
                             ranks=int(ua.get("ranks", spec.ranks)), run_dir=str(ua.get("run_dir", "")),
                             reason=str(ua.get("reason", "")), values=values,
                             step_s=float(ua["step_s"]) if "step_s" in ua else None))
    complete = [r for r in rows if r.state == "complete" and r.value is not None and math.isfinite(r.value)]
    best = None
    if complete:
        best = (max if spec.higher_is_better else min)(complete, key=lambda r: r.value)  # type: ignore[arg-type,return-value]
    used = sum(r.seconds * r.ranks for r in rows) / 3600
    to_end = sum(r.gpu_hours_to_end() for r in rows)
    return Summary(rows, best, spec.metric, spec.higher_is_better, spec.n_trials, used, to_end,
                   sum(r.steps for r in rows), sum(r.max_steps for r in rows))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_status(sweep_dir: Path, as_json: bool = False) -> None:
    s = collect(sweep_dir)
    if as_json:
        out = asdict(s)
        print(json.dumps(out, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"search {Path(sweep_dir).name}: {len(s.trials)} of {s.n_trials} trials, by {s.metric} "
                        f"({'higher' if s.higher_is_better else 'lower'} is better)")
    for col in ("trial", "params", "state", "last value", "steps", "run directory"):
        table.add_column(col)
    for r in s.trials:
        state = r.state + (f" ({r.reason})" if r.reason else "")
        table.add_row(str(r.number), " ".join(f"{k}={_fmt(v)}" for k, v in r.params.items()), state,
                      "-" if r.value is None else f"{r.value:.4f}", f"{r.steps}/{r.max_steps}", r.run_dir)
    console = Console(width=200)
    console.print(table)
    if s.best is not None:
        print(f"best so far: trial {s.best.number} ({' '.join(f'{k}={_fmt(v)}' for k, v in s.best.params.items())}), "
              f"{s.metric} {s.best.value:.4f}, run directory {s.best.run_dir}")
    else:
        print("best so far: none (no trial complete yet)")
    print(f"GPU-hours used {s.gpu_hours:.4g} of {s.gpu_hours_to_end:.4g} had every trial run to the end; steps "
          f"{s.steps} of {s.steps_to_end}")


def write_report(sweep_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    s = collect(sweep_dir)
    if not any(r.values for r in s.trials):
        from contract.errors import ConfigError

        raise ConfigError(f"{sweep_dir}: no trial has reported {s.metric} yet: wait for the first evaluation "
                          "(eval.every) and run the report again")
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
    ax.set_ylabel(s.metric)
    ax.set_title(f"{Path(sweep_dir).name}: {s.metric} per trial (x: pruned)")
    finite = [v for r in s.trials for v in r.values.values() if math.isfinite(v)]
    if finite and not s.higher_is_better and min(finite) > 0:
        ax.set_yscale("log")
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
    ax_best.step(numbers, best, where="post", marker="o")
    if not best:  # an empty panel read as a drawing fault
        ax_best.text(0.5, 0.5, "no trial complete yet", ha="center", va="center", transform=ax_best.transAxes)
    ax_best.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are whole: no half-trial ticks
    ax_best.set_xlabel("trial")
    ax_best.set_ylabel(f"best {s.metric} so far")
    ax_best.set_title("best so far")
    fig.tight_layout()
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


def main_status(sweep_dir: Path, as_json: bool) -> int:
    print_status(sweep_dir, as_json)
    return 0


def main_report(sweep_dir: Path) -> int:
    from contract.errors import EXIT_BAD_INPUT, ConfigError

    try:
        for path in write_report(sweep_dir):
            print(path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
