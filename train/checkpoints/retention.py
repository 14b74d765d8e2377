"""Which checkpoints go (checkpoint.keep_last, keep_every; never the one checkpoint.keep_best keeps, nor one an
evaluation job has not read) and the evaluation job handed each evaluated checkpoint once it is complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.rules.keep_best import keep_best_ranking
from contract.rundir import ckpt_layout as layout
from contract.rundir import eval_results
from contract.rundir.measured import kept_for_best
from train.checkpoints import manifest as manifest
from train.observe.metrics import log


def _remove_all(doomed: list[layout.CheckpointDir]) -> None:
    for checkpoint in doomed:
        layout.remove(checkpoint)


def doomed_checkpoints(run_dir: Path, checkpoint_cfg: Any) -> list[layout.CheckpointDir]:
    """Retention (checkpoint.keep_last, keep_every), less the best by checkpoint.keep_best (as measured so far: read
    from the run directory, so a resume or a requeue keeps the same one) and the checkpoints an evaluation job has
    yet to read (whose measurement may make one of them the best)."""
    doomed = layout.to_delete(layout.list_checkpoints(run_dir), checkpoint_cfg.keep_last, checkpoint_cfg.keep_every)
    if not doomed:
        return []
    best = kept_for_best(run_dir, keep_best_ranking(checkpoint_cfg))
    return [c for c in doomed if c.step not in best and not eval_results.awaiting_evaluation(run_dir, c.step)]


def apply_retention(run_dir: Path, checkpoint_cfg: Any) -> None:
    """On the checkpoint I/O thread: retention's choice (which reads the run's measurements with keep_best) and the
    deletions (each drops its marker first)."""
    _remove_all(doomed_checkpoints(run_dir, checkpoint_cfg))


def _submit_evaluation(cfg: Any, run_dir: Path, step: int) -> None:
    """On the background thread: training never waits for sbatch. A refusal is logged and releases the checkpoint."""
    from train.evaluation.submit import submit_evaluation

    try:
        job_id = submit_evaluation(cfg, run_dir, step)
    except Exception as err:  # noqa: BLE001 - training goes on without this evaluation
        log.error("evaluation job of step %d not submitted: %s", step, err)
        eval_results.clear_pending(run_dir, step)
    else:
        log.info("evaluation of step %d submitted as job %s", step, job_id)
