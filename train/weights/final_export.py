"""checkpoint.export_hf=true: the verified Hugging Face export of a run's final checkpoint, written by rank 0 after the
last save and after the loop (no collective waits on it; the other ranks go on to exit), read back from the
checkpoint as launcher.export reads it. Its outcome goes to RUN_DIR/export/hf_export.json for launcher.status
(contract/rundir/hf_export.py); a failed export is logged and recorded, never a failed run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.errors import ConfigError
from contract.rundir import ckpt_layout as layout
from contract.rundir.hf_export import export_path, write_record


def export_at_end(cfg: Any, env: Any, run_dir: Path, step: int, finished: bool) -> None:
    """Rank 0, once training finished at trainer.max_steps and its checkpoint is complete: export it."""
    if not (cfg.checkpoint.get("export_hf") and env.is_main and finished):
        return
    from train.observe.metrics import log

    checkpoint = layout.CheckpointDir(step, layout.step_dir(run_dir, step))
    out = export_path(run_dir, step)
    if not checkpoint.complete:
        log.warning("checkpoint.export_hf: no complete checkpoint of step %d to export", step)
        return
    if out.exists():
        log.info("checkpoint.export_hf: %s exists already (kept)", out)
        return
    from train.weights.export import load_model_state
    from train.weights.hf_export import ExportMismatch, export_hf

    try:
        exported = export_hf(cfg, load_model_state(checkpoint.path), out)
    except (ConfigError, ExportMismatch) as err:
        log.error("checkpoint.export_hf: the Hugging Face export of step %d failed, nothing written: %s", step, err)
        write_record(run_dir, step, out, False, str(err))
        return
    for line in exported.lines:
        log.info("checkpoint.export_hf: %s", line.removeprefix("export: "))
    log.info("checkpoint.export_hf: wrote %s", out)
    assert exported.verified is not None
    write_record(run_dir, step, out, True, exported.verified.describe())
