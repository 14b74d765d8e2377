"""A run's validation losses, from every place they are written: in-loop validation's rows of metrics.jsonl and
evaluation jobs' results in RUN_DIR/eval/ (contract/rundir/eval_results.py). Both hold `val/NAME/loss` and `val/NAME/ppl`
per set; launcher.status and launcher.report read them here, whichever wrote them. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from contract.rundir import eval_results
from contract.rundir.metrics_file import read_metrics

PREFIX, LOSS = "val/", "/loss"

Reader = Callable[[Path], list[dict[str, Any]]]
# Where validation rows come from, by name; a result of an evaluation job comes after metrics.jsonl's row of the
# same step, so it wins when both hold the same set (they agree: the same weights on the same samples).
SOURCES: dict[str, Reader] = {"in-loop": read_metrics, "evaluation job": eval_results.read_results}


def validation_rows(run_dir: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, {val/NAME/loss: ..., val/NAME/ppl: ...}) for every validation of the run, source after source."""
    for read in SOURCES.values():
        for row in read(run_dir):
            values = {k: v for k, v in row.items() if k.startswith(PREFIX)}
            if values:
                yield row["step"], values


def validated(run_dir: Path, step: int) -> bool:
    """Whether a validation of `step` is recorded already (a metrics.jsonl row or an evaluation job's result): the
    loop does not run that step's pass again when it resumes there (train/evaluation/validator.py due_at_start)."""
    return any(logged == step for logged, _ in validation_rows(run_dir))


def set_name(key: str) -> str | None:
    """NAME of a `val/NAME/loss` key; None for other keys."""
    if key.startswith(PREFIX) and key.endswith(LOSS) and len(key) > len(PREFIX) + len(LOSS):
        return key[len(PREFIX):-len(LOSS)]
    return None


def _loss(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def loss_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{NAME: [(step, loss), ...]} by step, one loss per step (nan and inf kept: a diverged validation)."""
    curves: dict[str, dict[int, float]] = {}
    for step, values in validation_rows(run_dir):
        for key, value in values.items():
            name, loss = set_name(key), _loss(value)
            if name is not None and loss is not None:
                curves.setdefault(name, {})[step] = loss
    return {name: sorted(by_step.items()) for name, by_step in sorted(curves.items())}


def last_losses(run_dir: Path) -> dict[str, dict[str, float | int]]:
    """{NAME: {"step": the newest validated step, "loss": its loss}} per set."""
    return {name: {"step": curve[-1][0], "loss": curve[-1][1]} for name, curve in loss_curves(run_dir).items()}


def describe(losses: dict[str, dict[str, float | int]]) -> str:
    """`val 2.3104 @40, code 2.9000 @40` for a table cell (nan, inf as such); `-` when there is none."""
    return ", ".join(f"{name} {float(last['loss']):.4f} @{last['step']}" for name, last in losses.items()) or "-"
