"""RUN_DIR/export/hf_export.json: what checkpoint.export_hf=true did at the end of training (rank 0 writes it after the
export, launcher.status reads it). Torch-free.

    {"step": 20, "time": 1767000000.0, "path": "/runs/r/export/hf_step_20", "ok": true,
     "detail": "verified: logits within 2.1e-06 of slurmtrain's (tolerance 5.0e-04) on 3 prompts of 64 tokens; ..."}

`ok` false: nothing was written at `path`, and `detail` says why (a verification that missed, and by how much; a
model whose check does not fit in memory). Written atomically (a temporary file renamed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from contract.data.manifest import write_json_atomic

EXPORT_DIR = "export"  # launcher.export's default destination too
RECORD = "hf_export.json"


def export_path(run_dir: Path, step: int) -> Path:
    """Where the Hugging Face export of step N goes (launcher.export --format hf's default as well)."""
    return Path(run_dir) / EXPORT_DIR / f"hf_step_{step}"


def write_record(run_dir: Path, step: int, path: Path, ok: bool, detail: str) -> None:
    record = Path(run_dir) / EXPORT_DIR / RECORD
    record.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record, {"step": step, "time": time.time(), "path": str(path), "ok": ok, "detail": detail})


def read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((Path(run_dir) / EXPORT_DIR / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "step" in record else None


def describe(record: dict[str, Any]) -> str:
    """The line launcher.status prints under a run's row."""
    if record.get("ok"):
        return f"Hugging Face export: step {record['step']} at {record['path']} ({record.get('detail', '')})"
    return f"Hugging Face export of step {record['step']} failed, nothing written: {record.get('detail', '')}"
