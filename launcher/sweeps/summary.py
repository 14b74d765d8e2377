"""The table that ends a local sweep (no +cluster): each point's result, step, final loss and its value of the metric
the points are ranked by (launcher/observe/ranking.py: the first validation set's loss when they have one, else
the training loss averaged over the last logged interval), best first, the title saying which metric ranks them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from contract.errors import EXIT_KILLED, EXIT_STOPPED
from contract.rundir import ckpt_layout as layout
from contract.rundir.metrics_file import read_metrics, training_rows
from launcher.observe.ranking import rank_runs
from launcher.sweeps.points import PointRun


def last_row(run_dir: Path) -> dict[str, Any]:
    """The newest row of a training step (a row of validation alone has no loss)."""
    rows = training_rows(read_metrics(run_dir))
    return rows[-1] if rows else {}


def result_words(p: PointRun, code: int | None) -> str:
    return {None: p.action if p.action != "run" else "not run", 0: "finished", EXIT_STOPPED: "stopped (resumable)",
            EXIT_KILLED: "killed (resumable from its last checkpoint)"}.get(code, f"failed (exit {code})")


def print_summary(points: list[PointRun], codes: dict[int, int | None], sweep_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    ranked = rank_runs([p.run_dir for p in points])
    table = Table(title=f"sweep {sweep_dir.name}, {ranked.describe()}")
    for col in ("rank", "point", "overrides", "result", "step", "final loss", ranked.header, "run directory"):
        table.add_column(col)
    for p in sorted(points, key=lambda p: (p.run_dir not in ranked.ranks, ranked.ranks.get(p.run_dir, 0))):
        row = last_row(p.run_dir)
        loss = f"{row['loss']:.4f}" if "loss" in row else "-"
        latest = layout.latest_complete_checkpoint(p.run_dir)
        step = max(int(row.get("step", 0)), latest.step if latest else 0)  # a stop saves past the last logged step
        value = ranked.values.get(p.run_dir)
        table.add_row(str(ranked.ranks.get(p.run_dir, "-")), str(p.point.index), p.label,
                      result_words(p, codes.get(p.point.index)), f"{step}/{p.cfg.trainer.max_steps}", loss,
                      "-" if value is None else f"{value:.4f}", str(p.run_dir))
    Console(stderr=True, width=200).print(table)
    print(f"sweep directory: {sweep_dir}", file=sys.stderr)
