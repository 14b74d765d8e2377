"""RUN_DIR/metrics.jsonl: one strict-JSON object per logged step, written by train/observe/metrics.py, read by everyone.

Strict JSON has no token for a number that is not finite (Python's json writes a bare `NaN`, which most parsers
refuse), and any value of a row can become one when a run diverges: the loss, the gradient norm, the learning rate,
a telemetry figure, an element of a per-rank list. Such a number is written as the string "nan", "inf" or "-inf";
`decode_row` turns those strings back into floats, so readers get real numbers. The values under TEXT_KEYS are text
(a straggler's host) and are never decoded. Older files with bare NaN tokens still read.

Torch-free and small on purpose: the launcher (status, report, sweeps), the training side, the benchmarks and the
tests all go through this one encoder and decoder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE_NAME = "metrics.jsonl"
NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
TEXT_KEYS = frozenset({"host"})


def number_text(value: float) -> str:
    """How a non-finite float is written: "nan", "inf" or "-inf"."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def to_json_value(value: Any) -> Any:
    """`value` with every non-finite float (in dicts and lists too) replaced by its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return number_text(value)
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    return value


def from_json_value(value: Any, key: str | None = None) -> Any:
    """The inverse of to_json_value: "nan", "inf" and "-inf" become floats again, except under TEXT_KEYS."""
    if isinstance(value, str):
        return NONFINITE_TEXT.get(value, value) if key not in TEXT_KEYS else value
    if isinstance(value, dict):
        return {k: from_json_value(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_value(v, key) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON (non-finite floats as text); what `launcher.status --json` prints too."""
    return json.dumps(to_json_value(value), allow_nan=False, **kwargs)


def encode_row(row: dict[str, Any]) -> str:
    """One metrics.jsonl line, without its newline."""
    return dumps(row)


def decode_row(line: str) -> dict[str, Any]:
    """One metrics.jsonl line as a row with real floats; ValueError when it is not a JSON object."""
    row = json.loads(line)
    if not isinstance(row, dict):
        raise ValueError(f"not a metrics row: {line[:80]!r}")
    decoded: dict[str, Any] = from_json_value(row)
    return decoded


def read_file(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics file that have an integer step; a torn last line (the writer was killed mid-write) or
    any other unparsable line is skipped; no file, no rows."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = decode_row(line)
        except ValueError:
            continue
        if isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """RUN_DIR/metrics.jsonl's rows (see read_file)."""
    return read_file(Path(run_dir) / FILE_NAME)


def training_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a training step: those with the step's `loss` (nan included). A row of validation alone (step 0
    with eval.at_start; a resume's repeated pass before that was fixed, with a tokens_per_s of 0) trained nothing:
    it is no loss, learning-rate or throughput sample, and not the run's last loss."""
    return [row for row in rows if "loss" in row]


def is_nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def nonfinite_since(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The first row of the non-finite `key` values the rows end with (None when the last value is finite or
    missing): the step since which a diverged run has logged nan or inf."""
    first = None
    for row in reversed(rows):
        if not is_nonfinite(row.get(key)):
            break
        first = row
    return first
