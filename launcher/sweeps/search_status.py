"""What a search has done, read from its study: `python -m launcher.status SWEEP_DIR` (a table of the trials and a
summary; --json: its rows and total) and the figures' data (launcher/sweeps/search_report.py draws them)."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract.search import layout
from contract.search.progress import steady_step_seconds, steps_trained
from launcher.sweeps.trial_state import holders, live_state

# Optuna's states; a RUNNING trial is told apart further (launcher/sweeps/trial_state.py): running, pending, stopped,
# interrupted.
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
    step_s: float | None = None  # a trained step's wall time once running (contract/search/progress.py)
    accounted_steps: int | None = None  # the steps its ended attempts trained (what `seconds` paid for)

    def gpu_hours_to_end(self, pace: float | None = None) -> float:
        """GPU-hours had this trial run to its last step: what its ended attempts used, plus the steps they left at
        its steady pace; without one of its own (fewer than two logged rows in an attempt) at `pace`, the other
        trials' (their start-up is not a step's time: it made an interrupted trial's hours read ~20x high); at its
        own seconds per step, start-up included, only when no trial has a pace."""
        done = self.steps if self.accounted_steps is None else self.accounted_steps
        left = max(self.max_steps - done, 0)
        step_s = self.step_s if self.step_s is not None else pace
        if step_s is not None:
            return (self.seconds + left * step_s) * self.ranks / 3600
        return self.seconds * self.ranks * (self.max_steps / done if done else 1.0) / 3600


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
    # The trials of search.n_trials not started yet (a stopped or cancelled search owes them; the same search
    # command runs them), and the GPU-hours and steps with them too, each at the started trials' mean.
    not_started: int = 0
    gpu_hours_all: float = 0.0
    steps_all: int = 0


def collect(sweep_dir: Path) -> Summary:
    from contract.search.optuna_objects import load_study

    spec = layout.load_spec(sweep_dir)
    study = load_study(sweep_dir, spec)
    rows = []
    held = holders(sweep_dir)
    for t in study.get_trials(deepcopy=False):
        values = dict(t.intermediate_values)
        last = values[max(values)] if values else None
        ua = t.user_attrs
        steps = int(ua.get("steps", max(values) if values else 0))
        row = TrialRow(number=t.number, params=dict(t.params), state=STATES.get(t.state.name, t.state.name),
                       value=t.value if t.value is not None else last, steps=steps,
                       max_steps=int(ua.get("max_steps", spec.max_steps)), seconds=float(ua.get("seconds", 0)),
                       ranks=int(ua.get("ranks", spec.ranks)), run_dir=str(ua.get("run_dir", "")),
                       reason=str(ua.get("reason", "")), values=values,
                       step_s=float(ua["step_s"]) if "step_s" in ua else None, accounted_steps=steps)
        if row.state == "running" and row.run_dir:  # the study says only that no worker told it the end
            run_dir = Path(row.run_dir)
            row.state, row.reason = live_state(run_dir, held.get(t.number))
            row.steps = max(steps, steps_trained(run_dir), max(values, default=0))
            row.step_s = row.step_s if row.step_s is not None else steady_step_seconds(run_dir)
        rows.append(row)
    complete = [r for r in rows if r.state == "complete" and r.value is not None and math.isfinite(r.value)]
    best = None
    if complete:
        best = (max if spec.higher_is_better else min)(complete, key=lambda r: r.value)  # type: ignore[arg-type,return-value]
    used = sum(r.seconds * r.ranks for r in rows) / 3600
    paces = [r.step_s for r in rows if r.step_s is not None]
    pace = statistics.median(paces) if paces else None
    to_end = sum(r.gpu_hours_to_end(pace) for r in rows)
    steps_to_end = sum(r.max_steps for r in rows)
    owed = max(spec.n_trials - len(rows), 0)
    per_trial = to_end / len(rows) if rows else 0.0
    return Summary(rows, best, spec.metric, spec.higher_is_better, spec.n_trials, used, to_end,
                   sum(r.steps for r in rows), steps_to_end, owed, to_end + owed * per_trial,
                   steps_to_end + owed * spec.max_steps)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_status(sweep_dir: Path, as_json: bool = False) -> None:
    s = collect(sweep_dir)
    if as_json:
        # {"rows": [...], "total": {...}} as for any run directory (docs/telemetry.md), and the search's own fields.
        print(json.dumps({"rows": [asdict(r) for r in s.trials], "total": total(s),
                          "best": None if s.best is None else asdict(s.best), "metric": s.metric,
                          "higher_is_better": s.higher_is_better, "n_trials": s.n_trials}, indent=2, default=str))
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
        print(f"best so far: none: {no_best(s)}")
    print(f"GPU-hours used {s.gpu_hours:.4g} of {s.gpu_hours_to_end:.4g} had every trial run to the end; steps "
          f"{s.steps} of {s.steps_to_end}")
    if s.not_started:
        about = f" (about {s.gpu_hours_all:.4g} GPU-hours and {s.steps_all} steps with them)" if s.trials else ""
        print(f"{s.not_started} of the search's {s.n_trials} trials not started yet{about}: the same search command "
              "runs them")


def total(s: Summary) -> dict[str, Any]:
    """The trials together: how many in each state, the GPU-hours and steps used and had every trial run to the end."""
    return {"trials": len(s.trials), "n_trials": s.n_trials, "states": dict(Counter(r.state for r in s.trials)),
            "gpu_hours": s.gpu_hours, "gpu_hours_to_end": s.gpu_hours_to_end, "steps": s.steps,
            "steps_to_end": s.steps_to_end, "not_started": s.not_started, "gpu_hours_all_trials": s.gpu_hours_all,
            "steps_all_trials": s.steps_all}


def how_trials_ended(s: Summary) -> str | None:
    """How every trial ended ('3 pruned, 1 failed'); None while one still trains, waits or will resume."""
    counts = Counter(r.state for r in s.trials)
    if set(counts) - {"complete", "pruned", "failed"}:
        return None
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def no_best(s: Summary) -> str:
    """Why there is no best: no trial complete yet while some still train or will resume; else how every trial ended
    and what to change (every one pruned: the pruner or the space; failed: their reasons)."""
    counts = Counter(r.state for r in s.trials)
    if not s.trials:
        return "no trial was trained (the budget was spent before the first)"
    ended = how_trials_ended(s)
    if ended is None:
        return "no trial complete yet"
    said = f"no trial completed with a finite {s.metric} ({ended}): there is no best"
    loosen = "widen the space, or loosen search.pruner (search.min_improvement=0 turns off the step-0 rule)"
    if counts.get("pruned") == len(s.trials):
        return f"{said}; every trial was pruned: {loosen}"
    if counts.get("pruned"):
        return f"{said}; the table says why each ended: {loosen}"
    return f"{said}; the table says why each ended: its reasons are the failures to mend"


def main_status(sweep_dir: Path, as_json: bool) -> int:
    print_status(sweep_dir, as_json)
    return 0
