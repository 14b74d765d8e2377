"""checkpoint.keep_best=METRIC: keep the checkpoint that measured best beside keep_last and keep_every. Torch-free.

The launch checks the metric against what the run will measure (check_keep_best); retention on the ranks and in
evaluation jobs keeps the step contract/rundir/measured.py finds best. A checkpoint counts once its step is measured:
in the loop (eval.every: a validation pass before the step's save) or by its evaluation job (eval.async_jobs), which
keeps the checkpoint (its pending marker) until its result is written.
"""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError
from contract.rules.eval_jobs import jobs_enabled
from contract.rules.eval_sets import enabled, resolved_sets
from contract.rules.metric_order import Ranking, ranking

KEY = "checkpoint.keep_best"
VAL_METRICS = ("loss", "ppl")


def keep_best_ranking(checkpoint_cfg: Any) -> Ranking | None:
    """The run's keep_best as a Ranking (None: unset, or a config written before the key existed)."""
    spec = checkpoint_cfg.get("keep_best") if hasattr(checkpoint_cfg, "get") else getattr(checkpoint_cfg,
                                                                                             "keep_best", None)
    return ranking(str(spec), KEY) if spec else None


def _harness_tasks(cfg: Any) -> list[str]:
    harness = (cfg.eval.get("harness") if hasattr(cfg.eval, "get") else None) or {}
    return [str(task) for task in (harness.get("tasks") if hasattr(harness, "get") else None) or []]


def check_keep_best(cfg: Any) -> None:
    """Launch-time refusals, one line each: a metric the run never measures, or measures on too few checkpoints."""
    raw = cfg.checkpoint.get("keep_best")
    if not raw:
        return
    spec = f"{KEY}={raw}"
    metric = str(raw).rpartition(":")[0] if ":" in str(raw) else str(raw)
    if not enabled(cfg) and not jobs_enabled(cfg):
        raise ConfigError(f"{spec} needs the checkpoints measured: validate in the loop with eval.every=N (a divisor "
                          "of trainer.ckpt_every), or with evaluation jobs (eval.async_jobs=true on a cluster)")
    parts = metric.split("/")
    if parts[0] == "val":
        sets = list(resolved_sets(cfg))
        if len(parts) != 3 or parts[1] not in sets or parts[2] not in VAL_METRICS:
            raise ConfigError(f"{spec}: the run measures {', '.join(f'val/{s}/loss' for s in sets)} (and each set's "
                              f"/ppl): name one of them (validation sets: eval.sets)")
    elif parts[0] == "harness":
        tasks = _harness_tasks(cfg)
        if len(parts) < 3 or parts[1] not in tasks:
            listed = ", ".join(tasks) if tasks else "none"
            raise ConfigError(f"{spec}: harness/TASK/METRIC names a task of eval.harness.tasks ({listed}): add the "
                              "task there, or name one of them")
    else:
        raise ConfigError(f"{spec}: keep the best by what evaluation measures: val/NAME/loss, val/NAME/ppl or "
                          "harness/TASK/METRIC")
    keep_best_ranking(cfg.checkpoint)  # its direction: known from the name, or said with :max or :min
    every, ckpt_every = int(cfg.eval.every), int(cfg.trainer.ckpt_every)
    if enabled(cfg) and not jobs_enabled(cfg) and ckpt_every and ckpt_every % every:
        raise ConfigError(f"{spec} compares checkpoints by what was measured at their steps, and eval.every={every} "
                          f"does not measure every checkpoint (trainer.ckpt_every={ckpt_every}): set eval.every to a "
                          f"divisor of {ckpt_every}")
