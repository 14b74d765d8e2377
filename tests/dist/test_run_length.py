"""trainer.max_tokens on 2 ranks, as a user types it: the run stops at the first step whose tokens reach the budget,
the plan's length line and its schedule end at that step (the rates are those of a run of that many steps), and the same
command with a larger budget extends the same run directory (the budget is not part of the run name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.rules.schedules import Schedule
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

# 2 ranks x micro batch 4, 32 tokens a sample: 256 tokens a step.
PER_STEP = 2 * 4 * 32
PEAK, WARMUP, FLOOR = 3e-3, 5, 0.1  # conf/optim/adamw.yaml


def _command(run_root: Path, budget: int) -> list[str]:
    return [f"trainer.max_tokens={budget}", "local.nproc=2", "trainer.micro_batch_size=4", "model.max_seq_len=32",
            "model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", "trainer.log_every=1",
            "trainer.ckpt_every=0", "logger.backend=none", f"run.root={hq(run_root)}"]


def test_max_tokens_stops_at_the_first_step_that_reaches_it_and_extends_the_same_run(run_root: Path) -> None:
    budget = 7 * PER_STEP - 100  # step 6 holds 1536 tokens, step 7 1792 >= 1692
    first = launch(*_command(run_root, budget))
    assert first.returncode == 0, first.stderr[-3000:]
    assert (f"length: trainer.max_tokens={budget:,} = 7 steps of {PER_STEP} tokens ({7 * PER_STEP:,} tokens: step 7 "
            "is the first to reach it)") in first.stderr
    # The schedule ends there: the plan's rate for step 7 is the 7-step cosine's, and so is every logged rate.
    schedule = Schedule("cosine", 7, WARMUP, FLOOR)
    assert f"cosine decay toward 0.0003, step 7 trains at {PEAK * schedule.factor(6):.4g}" in first.stderr
    [run_dir] = [p for p in run_root.iterdir() if (p / "config.yaml").is_file()]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert rows[-2]["tokens"] < budget <= rows[-1]["tokens"] == 7 * PER_STEP
    assert [r["lr"] for r in rows] == pytest.approx([PEAK * schedule.factor(k) for k in range(7)])

    # The same command with a larger budget resumes the same directory, and its schedule re-stretches to the new end.
    second = launch(*_command(run_root, 10 * PER_STEP))
    assert second.returncode == 0, second.stderr[-3000:]
    assert [p for p in run_root.iterdir() if (p / "config.yaml").is_file()] == [run_dir]
    assert "resumes after step 7 of 10" in second.stderr
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 11)) and rows[-1]["tokens"] == 10 * PER_STEP

    again = launch(*_command(run_root, 10 * PER_STEP))
    assert again.returncode == 0 and (f"is already at step 10 of trainer.max_tokens={10 * PER_STEP} (step 10) "
                                      "(raise trainer.max_tokens to train on)") in again.stderr
    # A budget below the newest checkpoint says which key to raise.
    lower = launch(*_command(run_root, 3 * PER_STEP))
    assert lower.returncode == 2 and (f"past trainer.max_tokens={3 * PER_STEP} (step 3): raise trainer.max_tokens past "
                                      "step 10") in lower.stderr
