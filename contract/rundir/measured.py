"""What a run measured, any metric by name, and the checkpoint that measured best. Torch-free: retention on the ranks
(checkpoint.keep_best), an evaluation job, launcher.status, `--best` and a sweep's ranking read the same answer.

A metric's values come from every place measurements are written (validation_log.SOURCES: metrics.jsonl's rows, then
the evaluation jobs' eval/step_N.json), one value per step, the later source winning, as validation_log reads the
validation losses. Nothing is kept beside them: the best checkpoint is recomputed from the run directory, so it
survives a resume, a requeue and evaluation results that arrive after the checkpoint was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.rules.metric_order import Ranking
from contract.rundir import ckpt_layout as layout
from contract.rundir.validation_log import PREFIX, SOURCES, set_name


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def values(run_dir: Path, metric: str) -> dict[int, float]:
    """{step: value} of `metric` over the run (nan and inf kept: a diverged measurement)."""
    by_step: dict[int, float] = {}
    for read in SOURCES.values():
        for row in read(run_dir):
            value = _number(row.get(metric))
            if value is not None:
                by_step[row["step"]] = value
    return dict(sorted(by_step.items()))


def names(run_dir: Path) -> set[str]:
    """Every metric the run measured: the keys of its rows that hold a number (not the step or the clock)."""
    out: set[str] = set()
    for read in SOURCES.values():
        for row in read(run_dir):
            out.update(k for k, v in row.items() if k not in ("step", "time") and _number(v) is not None)
    return out


def first_validation_loss(run_dir: Path) -> str | None:
    """`val/NAME/loss` of the run's first validation set (the order its rows hold them in: eval.sets'), if it has
    measured one."""
    for read in SOURCES.values():
        for row in read(run_dir):
            for key in row:
                if key.startswith(PREFIX) and set_name(key) is not None:
                    return str(key)
    return None


@dataclass(frozen=True)
class Best:
    """The complete checkpoint whose step measured best, among the `kept` complete checkpoints with a value (of
    `complete` in all); the run measured `measured` steps in all (retention removed the checkpoints of some, others
    had none)."""

    checkpoint: layout.CheckpointDir
    value: float
    ranking: Ranking
    kept: int
    measured: int
    complete: int  # complete checkpoints, measured or not

    def describe(self) -> str:
        among = f"the best of {self.kept} measured checkpoint{'s' if self.kept != 1 else ''}"
        if self.complete > self.kept:  # some kept checkpoints have no measurement of this metric
            among = (f"the best of the {self.kept} measured of {self.complete} kept checkpoints; {self.measured} "
                     f"step{'s' if self.measured != 1 else ''} measured")
        elif self.measured > self.kept:
            among = (f"the best of the {self.kept} kept checkpoint{'s' if self.kept != 1 else ''}; {self.measured} "
                     "steps measured")
        return f"step {self.checkpoint.step}, {self.ranking.metric} {self.value:.4f} ({self.ranking.direction}; {among})"


def best_checkpoint(run_dir: Path, ranking: Ranking) -> Best | None:
    """The complete checkpoint whose step has the best finite value of the metric (a tie: the earliest); None when
    no complete checkpoint's step was measured."""
    measured = values(run_dir, ranking.metric)
    complete = [c for c in layout.list_checkpoints(run_dir) if c.complete]
    scored = {c.step: c for c in complete if c.step in measured}
    step = ranking.best({s: measured[s] for s in scored})
    if step is None:
        return None
    return Best(scored[step], measured[step], ranking, len(scored), len(measured), len(complete))


def kept_for_best(run_dir: Path, ranking: Ranking | None) -> set[int]:
    """Retention's question for checkpoint.keep_best: the step it keeps (none without a ranking or a measurement)."""
    best = None if ranking is None else best_checkpoint(run_dir, ranking)
    return set() if best is None else {best.checkpoint.step}
