"""checkpoint.verify_early: a run's first attempt writes one checkpoint after step 1, reads it back into a scratch
copy of the model's and optimizer's state and compares them bit for bit, then deletes it (train/checkpoints/
early_check.py). A broken filesystem, a permission or quota problem, or a state that does not round-trip stops the
run in its first minutes, with one line naming it, rather than at its first periodic save hours in.

On by default (None: auto) for SLURM runs, where a run is long and its filesystem is the cluster's; off for local
runs, which save soon anyway. Both sides read `enabled`; the plan's line says what it costs.
"""

from __future__ import annotations

from typing import Any

# RUN_DIR/checkpoints/<this>: where the check writes, on the filesystem the run's checkpoints go to; removed after.
SCRATCH = ".verify_early"
GB = 1024**3


def enabled(cfg: Any) -> bool:
    setting = cfg.checkpoint.get("verify_early") if cfg.get("checkpoint") is not None else None
    if setting is None:
        return cfg.get("cluster") is not None
    return bool(setting)


def plan_line(cfg: Any, state_bytes_per_rank: float | None) -> str:
    """The plan's line: when the check runs and what it costs (one checkpoint's write and read), or '' when off."""
    if not enabled(cfg):
        return ""
    why = "checkpoint.verify_early" + ("" if cfg.checkpoint.get("verify_early") is not None else
                                       ", on by default for SLURM runs")
    size = (f"{state_bytes_per_rank / GB:.2f} GB per rank written and read once, about one synchronous save's time"
            if state_bytes_per_rank else "one synchronous save's time")
    return (f"checkpoint check: after step 1 of the first attempt a checkpoint is written to checkpoints/{SCRATCH}, "
            f"read back and compared bit for bit, then deleted ({why}; {size})")
