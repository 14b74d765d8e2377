"""A run's lm-evaluation-harness scores (`harness/TASK/METRIC`, `harness/TASK/METRIC_stderr`; contract/rules/harness.py
names them), from every place validation is written: in-loop rows of metrics.jsonl and evaluation jobs' (and
launcher.evaluate's) eval/step_N.json, read as validation_log reads the losses. launcher.status shows the latest,
launcher.report draws them against the step. Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from contract.rules.harness import CHANCE, PREFIX, describe
from contract.rundir.validation_log import SOURCES

STDERR = "_stderr"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def scores_by_step(run_dir: Path) -> dict[int, dict[str, float]]:
    """{step: {harness/...: value}}; a later source (an evaluation job's result) wins for the same key and step."""
    out: dict[int, dict[str, float]] = {}
    for read in SOURCES.values():
        for row in read(run_dir):
            values = {k: v for k, v in row.items() if k.startswith(PREFIX) and _number(v) is not None}
            if values:
                out.setdefault(int(row["step"]), {}).update(values)
    return dict(sorted(out.items()))


def chance(run_dir: Path) -> dict[str, float]:
    """{TASK: its chance accuracy} for the multiple-choice tasks scored (the newest value of each)."""
    out: dict[str, float] = {}
    for values in scores_by_step(run_dir).values():
        for key, value in values.items():
            task, _, metric = key[len(PREFIX):].rpartition("/")
            if task and metric == CHANCE:
                out[task] = value
    return out


def latest(run_dir: Path) -> dict[str, Any] | None:
    """{"step": the newest scored step, "scores": its harness values}; None when nothing was scored."""
    by_step = scores_by_step(run_dir)
    if not by_step:
        return None
    step = max(by_step)
    return {"step": step, "scores": by_step[step]}


def line(summary: dict[str, Any]) -> str:
    """`harness @60: pattern/acc 0.9400 ± 0.0168` for launcher.status."""
    return f"harness @{summary['step']}: {describe(summary['scores'])}"


def curves(run_dir: Path) -> dict[str, dict[str, list[tuple[int, float, float | None]]]]:
    """{TASK: {METRIC: [(step, value, stderr or None), ...]}} by step, for launcher.report."""
    out: dict[str, dict[str, list[tuple[int, float, float | None]]]] = {}
    for step, values in scores_by_step(run_dir).items():
        for key, value in values.items():
            task, _, metric = key[len(PREFIX):].rpartition("/")
            name, _, filt = metric.partition(",")
            if not task or name.endswith(STDERR) or name == CHANCE:
                continue
            stderr = _number(values.get(f"{PREFIX}{task}/{name}{STDERR}" + (f",{filt}" if filt else "")))
            out.setdefault(task, {}).setdefault(metric, []).append(
                (step, value, stderr if stderr is not None and math.isfinite(stderr) else None))
    return out
