"""A run that starts or resumes at a step whose validation is recorded (a metrics.jsonl row, an evaluation job's
result) does not run that pass again (Validator.due_at_start): a checkpoint is saved after its step's pass, and a
restart without one keeps the step-0 row. The whole runs, on 2 ranks: tests/dist/test_validation.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contract.rundir import eval_results, metrics_file
from tests.unit.test_validator_cache import _validator


def _rows(run_dir: Path, *rows: dict) -> None:
    (run_dir / metrics_file.FILE_NAME).write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))


@pytest.mark.parametrize("at_start", [True, False])
def test_a_step_is_validated_at_start_only_when_due_and_not_recorded(tmp_path: Path, at_start: bool) -> None:
    validator, _ = _validator([f"eval.at_start={str(at_start).lower()}", "trainer.max_steps=9"])  # eval.every=2
    assert validator.due_at_start(0, tmp_path) is at_start  # a first start: nothing recorded
    val = {"val/val/loss": 3.0, "val/val/ppl": math.exp(3.0)}
    _rows(tmp_path, {"step": 0, **val, "tokens": 0}, {"step": 1, "loss": 4.0, "tokens": 8},
          {"step": 4, "loss": 3.5, "tokens": 32, **val}, {"step": 6, "loss": 3.4, "tokens": 48})
    eval_results.write_result(tmp_path, 8, val, job="7")
    due = {step: validator.due_at_start(step, tmp_path) for step in range(10)}
    # 0: its row is kept by a restart; 4: validated before its checkpoint; 6: due, logged without a pass (eval.every
    # raised since); 8: an evaluation job's result; 9: the end, not reached before.
    assert [step for step, yes in due.items() if yes] == [2, 6, 9]
