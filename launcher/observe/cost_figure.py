"""launcher.report's goodput.png, drawn when a run had a failure: one horizontal bar per run, cut into what its
GPU-time went to (contract/rundir/failure_cost.py's parts, in rank-seconds from the first start to the end), and
under the bars each failure's line as launcher.status prints it (a replica group's loss: when it was seen, how many
groups trained those steps, the time to heal, the steps at reduced size; a plain run's failed attempt: the steps
trained again, the time to the next attempt, its queue wait and start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contract.rundir.events import read_events
from contract.rundir.failure_cost import LABELS, PARTS
from contract.rundir.replicas import failure_lines
from launcher.observe import run_cost
from launcher.observe.figures import _figure
from launcher.observe.runs import RunRef, load_config

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"trained": "tab:green", "startup": "tab:gray", "restart": "tab:red", "between": "tab:orange",
          "queue": "gold", "redone": "tab:purple", "stalled": "tab:pink", "checkpoint": "tab:blue",
          "other": "lightgray"}
MAX_NOTES = 8


def failed_runs(runs: list[RunRef]) -> list[tuple[RunRef, dict[str, Any], list[str]]]:
    """The runs that had a failure: each with its breakdown and its failure lines."""
    found = []
    for run in runs:
        config, _ = load_config(run.run_dir)
        breakdown = run_cost.cost(run.run_dir, config, run.jobs)
        notes = run_cost.cost_notes(run.run_dir, config, breakdown, run.jobs)
        if breakdown is None or not notes:
            continue
        groups = int((config.get("parallel") or {}).get("replica_groups") or 1)
        steps = int((config.get("trainer") or {}).get("max_steps") or 0)
        lines = failure_lines(read_events(run.run_dir), groups, steps) if groups > 1 else []
        found.append((run, breakdown, [*lines, *notes[:-1]]))
    return found


def cost_figure(runs: list[RunRef], title: str) -> Figure | None:
    """None when no run had a failure."""
    failed = failed_runs(runs)
    if not failed:
        return None
    notes = [f"{run.name}: {line}" for run, _, lines in failed for line in lines]
    shown = notes[:MAX_NOTES] + ([f"... and {len(notes) - MAX_NOTES} more"] if len(notes) > MAX_NOTES else [])
    bars_in, notes_in = 1.5 + 0.5 * len(failed), 0.2 + 0.15 * len(shown)
    fig = _figure((10.0, bars_in + notes_in))
    ax, below = fig.subplots(2, 1, height_ratios=[bars_in, notes_in])
    for y, (_, breakdown, _) in enumerate(failed):
        left = 0.0
        for part in PARTS:
            share = breakdown["parts"][part] / breakdown["total"] if breakdown["total"] > 0 else 0.0
            ax.barh(y, share, left=left, color=COLORS[part], label=LABELS.get(part, part) if y == 0 else None)
            left += share
        ax.annotate(f"goodput {breakdown['goodput']:.0%} of {breakdown['total']:,.0f} rank-s; failures "
                    f"{breakdown['failures'] / breakdown['total']:.0%}", (0.0, y), xytext=(2, 0),
                    textcoords="offset points", va="center", fontsize=8, color="white")
    ax.set_yticks(range(len(failed)), [run.name for run, _, _ in failed])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the rank-seconds from the first start to the end")
    ax.set_title(title, loc="left", fontsize=9)
    fig.legend(loc="outside upper center", ncols=5, fontsize=7)
    below.axis("off")
    below.text(0.0, 1.0, "\n".join(line[:220] for line in shown), fontsize=6, va="top", ha="left",
               transform=below.transAxes)
    return fig
