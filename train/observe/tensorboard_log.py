"""logger.backend=tensorboard: the metrics rows as TensorBoard scalars, in RUN_DIR/tensorboard/ (rank 0 writes).

The same values as wandb's (scalars.wandb_values: the scalars, one series per host or source), each at its row's
step and wall time. A resumed attempt, or an in-process rollback, redoes the steps after its checkpoint: it opens a
new event file whose purge step hides the earlier events past the checkpoint (TensorBoard's own purge_step, the
twin of metrics.jsonl dropping those rows), so each step shows once, as it was finally trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from train.observe.scalars import wandb_values

DIR_NAME = "tensorboard"


class TensorBoardLog:
    def __init__(self, run_dir: Path, step: int) -> None:
        self.log_dir = Path(run_dir) / DIR_NAME
        self.writer: Any = None
        self.restart(step)

    def restart(self, step: int) -> None:
        """Go on after `step` (the checkpoint trained to): events of later steps written before are hidden."""
        from torch.utils.tensorboard import SummaryWriter

        self.close()
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step + 1)

    def log(self, row: dict[str, Any]) -> None:
        for key, value in wandb_values(row).items():
            self.writer.add_scalar(key, value, global_step=row["step"], walltime=row.get("time"))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
