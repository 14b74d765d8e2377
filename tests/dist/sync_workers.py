"""Worker for tests/dist/test_sync_free.py: several short runs in one process group, each under a SyncCounter, and
what it counted per rank (steady steps, and every read of a steady step) into RUN_DIR/reads_rankN.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from launcher.compose import compose_and_plan
from tests.dist.workers import _join
from train import distributed
from train.loop import train
from train.observe.sync_count import SyncCounter

# A run's name ending in this puts back a per-step read of the loss (what the loop did before it kept the loss on the
# device), to show that the guard sees it.
REINSTATED = "-loss-read"


def count_reads(rank: int, world: int, port: int, out_dir: str, runs: dict[str, list[str]]) -> None:
    env = _join(rank, world, port)
    try:
        for name, overrides in runs.items():
            cfg, _ = compose_and_plan([f"local.nproc={world}", "logger.backend=none", *overrides])
            run_dir = Path(out_dir) / name
            run_dir.mkdir(parents=True, exist_ok=True)
            with _loss_read(name.endswith(REINSTATED)), SyncCounter() as counter:
                train(cfg, env, torch.device("cpu"), run_dir)
            counted = {"steady": counter.steady_steps(), "report": counter.report(),
                       "reads": [[r.step, r.kind, r.where, r.library] for r in counter.steady_reads()]}
            (run_dir / f"reads_rank{rank}.json").write_text(json.dumps(counted))
    finally:
        distributed.destroy_process_group()


class _loss_read:
    """While active (and asked for): IntervalLoss.add reads each step's loss as a float, as `loss.item()` did."""

    def __init__(self, on: bool) -> None:
        self.on, self.saved = on, None

    def __enter__(self) -> None:
        if self.on:
            from train.observe.metrics import IntervalLoss

            self.saved = IntervalLoss.add

            def add(interval: Any, loss: torch.Tensor) -> None:
                interval.last_value = float(loss)
                self.saved(interval, loss)  # type: ignore[misc]

            IntervalLoss.add = add  # type: ignore[method-assign]

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            from train.observe.metrics import IntervalLoss

            IntervalLoss.add = self.saved  # type: ignore[method-assign]
