"""The plan's effective batch and scaled learning rate are what training uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist


def test_effective_batch_and_scaled_lr_in_the_plan_are_what_training_uses(run_root: Path) -> None:
    out = launch("local.nproc=2", "trainer.global_batch_size=32", "trainer.micro_batch_size=4",
                 "optim.lr_scaling=linear", "optim.reference_batch_size=8", "optim.lr=1e-3", "optim.warmup_steps=0",
                 "trainer.max_steps=2", "trainer.log_every=1", "logger.backend=none", f"run.root={hq(run_root)}",
                 "run.name=lr")
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads((run_root / "lr" / "plan.json").read_text())
    assert plan["lr"] == pytest.approx(4e-3) and plan["global_batch_size"] == 32 and plan["grad_accum_steps"] == 4
    rows = read_metrics(run_root / "lr")
    assert rows[0]["lr"] == pytest.approx(plan["lr"])  # no warmup: step 1 trains at the peak rate
    assert rows[0]["tokens"] == plan["tokens_per_step"] == 32 * 64
    assert "learning rate 0.004 (optim.lr=0.001 x linear scaling" in out.stderr
