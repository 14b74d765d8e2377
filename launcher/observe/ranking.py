"""Choosing by what was measured: a run's best checkpoint (`--best` of launcher.export, launcher.sample and
launcher.evaluate) and a sweep's points ranked by one metric (launcher.status's table, launcher.report's
final_loss_vs_KEY.png, a local sweep's closing table). The direction rule is contract/rules/metric_order.py; the
measurements and the best checkpoint are contract/rundir/measured.py's, which retention (checkpoint.keep_best) reads too.

The metric, unless one is chosen (`--rank-by METRIC`; a run's own checkpoint.keep_best for `--best`): the first
validation set's loss when the runs have one, else the training loss averaged over the last logged interval
(`loss_avg` of metrics.jsonl; the last logged loss of a run written before it existed).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from contract.config.suggest import close_key
from contract.errors import ConfigError
from contract.rules.keep_best import keep_best_ranking
from contract.rules.metric_order import Ranking, ranking
from contract.rundir import ckpt_layout as layout
from contract.rundir import measured
from contract.rundir.metrics_file import read_metrics, training_rows
from launcher.observe.runs import load_config

TRAINING = Ranking("loss_avg", higher_is_better=False)
TRAINING_WORDS = "the training loss averaged over the last logged interval"


def run_ranking(run_dir: Path) -> tuple[Ranking, str] | None:
    """How `--best` compares a run's checkpoints, and why that metric: the run's checkpoint.keep_best, else its first
    validation set's loss; None when it has measured neither. ConfigError: its config.yaml is damaged (the way out)."""
    config, damage = load_config(run_dir)
    if damage is not None:
        raise ConfigError(damage)
    chosen = keep_best_ranking(config.get("checkpoint") or {})
    if chosen is not None:
        return chosen, "the run's checkpoint.keep_best"
    first = measured.first_validation_loss(run_dir)
    return (Ranking(first, higher_is_better=False), "the first validation set's loss") if first else None


def best_of_run(run_dir: Path) -> tuple[measured.Best, str]:
    """The complete checkpoint that measured best, and why that metric (run_ranking); ConfigError when there is none
    to choose."""
    chosen = run_ranking(run_dir)
    complete = [c.step for c in layout.list_checkpoints(run_dir) if c.complete]
    if not complete:
        raise ConfigError(f"{run_dir} has no complete checkpoint: train it first (or pass the run directory)")
    if chosen is None:
        raise ConfigError(f"--best compares checkpoints by what was measured, and {run_dir} has no validation loss "
                          "(checkpoint.keep_best unset, no eval.every): pick one with --step N")
    best = measured.best_checkpoint(run_dir, chosen[0])
    if best is None:
        raise ConfigError(f"--best: none of the complete checkpoints of {run_dir} (steps {complete}) has a measured "
                          f"{chosen[0].metric}: pick one with --step N")
    return best, chosen[1]


def describe_best(best: measured.Best, why: str) -> str:
    """`best checkpoint by the run's checkpoint.keep_best: step 40, val/val/loss 2.3104 (lower is better; ...)`."""
    return f"best checkpoint by {why}: {best.describe()}"


@dataclass
class SweepRanking:
    """The runs ranked by one metric: each run's value (its newest measurement), its rank (1: best; None: no finite
    value) and the words that say which metric it was."""

    ranking: Ranking
    words: str
    values: dict[Path, float] = field(default_factory=dict)
    steps: dict[Path, int] = field(default_factory=dict)
    ranks: dict[Path, int] = field(default_factory=dict)

    @property
    def header(self) -> str:
        return "train loss (avg)" if self.ranking is TRAINING else self.ranking.metric

    def describe(self) -> str:
        return f"ranked by {self.words} ({self.ranking.direction})"


def last_value(run_dir: Path, chosen: Ranking) -> tuple[int, float] | None:
    """A run's newest value of the metric, and its step."""
    if chosen is TRAINING:
        rows = training_rows(read_metrics(run_dir))
        if not rows:
            return None
        value = rows[-1].get("loss_avg", rows[-1]["loss"])
        return (rows[-1]["step"], float(value)) if isinstance(value, int | float) else None
    by_step = measured.values(run_dir, chosen.metric)
    return (max(by_step), by_step[max(by_step)]) if by_step else None


def rank_runs(run_dirs: list[Path], rank_by: str | None = None) -> SweepRanking:
    """The runs ranked by `rank_by` (METRIC, METRIC:max or :min; ConfigError when no run measured it), or by the
    default: the first validation set's loss when any run has one, else the training loss."""
    if rank_by:
        _refuse_unmeasured(run_dirs, rank_by)
        chosen = ranking(rank_by, "--rank-by")
        result = SweepRanking(chosen, chosen.metric)
    else:
        first = next((name for run_dir in run_dirs if (name := measured.first_validation_loss(run_dir))), None)
        result = (SweepRanking(Ranking(first, higher_is_better=False), f"the first validation set's loss, {first}")
                  if first else SweepRanking(TRAINING, f"{TRAINING_WORDS} (no run has a validation loss)"))
    for run_dir in run_dirs:
        found = last_value(run_dir, result.ranking)
        if found is not None:
            result.steps[run_dir], result.values[run_dir] = found
    if rank_by and not result.values:
        raise ConfigError(f"--rank-by {rank_by}: no run has measured {result.ranking.metric}: name a key of their "
                          "metrics.jsonl rows or eval/step_N.json results")
    order = sorted((d for d in result.values if result.ranking.order(result.values[d])[0] == 0),
                   key=lambda d: result.ranking.order(result.values[d]))
    result.ranks = {run_dir: i + 1 for i, run_dir in enumerate(order)}
    return result


SHOWN_METRICS = 8


def _refuse_unmeasured(run_dirs: list[Path], rank_by: str) -> None:
    """A metric none of the runs measured (`--rank-by val/val/los`): refused before its direction is asked for,
    suggesting only what they measured (it suggested val/val/loss to runs that never validated)."""
    metric = rank_by.strip()
    metric = metric.rpartition(":")[0] if metric.endswith((":max", ":min")) else metric
    found = set().union(*(measured.names(d) for d in run_dirs)) if run_dirs else set()
    if not found or metric in found:
        return
    # Validation and evaluation results first (what a sweep is ranked by), then the training loss, then the rest.
    order = sorted(found, key=lambda k: (not k.startswith(("val/", "harness/")), k not in ("loss_avg", "loss"), k))
    close = close_key(metric, order) or next(iter(difflib.get_close_matches(metric, order, n=1, cutoff=0.6)), None)
    listed = ", ".join(order[:SHOWN_METRICS]) + (", ..." if len(order) > SHOWN_METRICS else "")
    fix = f"did you mean --rank-by {close}?" if close else f"name one they measured ({listed})"
    raise ConfigError(f"--rank-by {rank_by}: no run measured {metric}: {fix}")
