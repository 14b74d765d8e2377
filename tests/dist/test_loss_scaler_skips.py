"""fp16 (issue 22 follow-up): the steps torch's loss scaler skips are counted (metrics.jsonl's scaler_skipped, an
events.jsonl line each, reason loss_scale) and are no trouble; once the scale has collapsed to 1 an overflow is a
non-finite step, and stability.nonfinite decides (stop here: one line naming the step).

One process through the real launcher: rank 0's gradients are NaN at step 3 (a lone overflow, routine), then at
every step from 8 on (a model past saving): the scale halves at each, from GradScaler's 2**16."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from contract.errors import EXIT_DIVERGED
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

LONE, FROM = 3, 8
HALVINGS = int(math.log2(torch.amp.GradScaler("cpu").get_scale()))  # overflows that bring the scale down to 1


def test_scaler_skips_are_counted_until_the_collapsed_scale_stops_the_run(tmp_path: Path) -> None:
    nans = ",".join(f"{s}:0" for s in [LONE, *range(FROM, 40)])
    out = launch("trainer.log_every=1", "logger.backend=none", "trainer.progress_bar=false", "local.nproc=1",
                 f"run.root={hq(tmp_path)}", "run.name=fp16", "precision=fp16", "trainer.max_steps=40",
                 "trainer.ckpt_every=4", "stability.nonfinite=stop", SLURMTRAIN_TEST_NAN_GRAD=nans)
    # Every overflow halves the scale; the one after HALVINGS of them meets a scale of 1: the end.
    end = FROM + HALVINGS - 1
    assert out.returncode == EXIT_DIVERGED, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: stopped at step {end}: "), out.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "fp16" / "events.jsonl").read_text().splitlines()]
    skipped = [(e["step"], e["reason"]) for e in events if e["kind"] == "skipped_step"]
    assert skipped == [(s, "loss_scale") for s in [LONE, *range(FROM, end)]] + [(end, "nonfinite")]
    rows = {r["step"]: r for r in read_metrics(tmp_path / "fp16")}
    assert [rows[s]["scaler_skipped"] for s in (LONE - 1, LONE, FROM - 1, end - 1)] == [0, 1, 1, HALVINGS]
    assert rows[end - 1]["loss_scale"] == 1.0 and rows[end - 1]["skipped_steps"] == 0  # no trouble before the end
    assert rows[LONE + 1]["loss"] != rows[LONE]["loss"]  # training went on after the lone overflow
    assert events[-1]["kind"] == "diverged"
