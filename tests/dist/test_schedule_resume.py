"""Extending a finished run with a larger trainer.max_steps trains on the schedule the new config describes, from
its first resumed step: a wsd run whose stable phase ends where the first run stopped anneals exactly as an
uninterrupted run of the same config (loss for loss), and an extended cosine run does what the plan said."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import hq, launch, read_metrics
from contract.rules.schedules import Schedule

pytestmark = pytest.mark.dist

PEAK, WARMUP, FLOOR = 3e-3, 5, 0.1  # conf/optim/adamw.yaml


def _common(run_root: Path, *keys: str) -> list[str]:
    # A smaller model than tiny's: the launches, not the steps, are the test's time.
    return [*keys, "model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", "trainer.log_every=1",
            "logger.backend=none", f"run.root={hq(run_root)}"]


def _rows(run_dir: Path) -> dict[int, dict[str, Any]]:
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))  # every step once, none left from before
    return {r["step"]: r for r in rows}


def _closed_form(schedule: Schedule, steps: range) -> dict[int, float]:
    """The rate step k trains at: the peak times the schedule after k - 1 steps done."""
    return {k: PEAK * schedule.factor(k - 1) for k in steps}


def test_an_extended_wsd_run_anneals_bitwise_like_an_uninterrupted_one(run_root: Path) -> None:
    wsd = _common(run_root, "optim.schedule=wsd", "optim.decay_start_step=100")
    with ThreadPoolExecutor(1) as pool:  # the uninterrupted run beside the two launches of the extended one
        running = pool.submit(launch, *wsd, "trainer.max_steps=150", "run.name=whole")
        first = launch(*wsd, "trainer.max_steps=100", "run.name=extended")
        assert first.returncode == 0, first.stderr[-3000:]
        second = launch(*wsd, "trainer.max_steps=150", "run.name=extended")
        whole = running.result()
    assert ("wsd schedule: warmup 5 steps, stable to step 100 (no decay in this run: raise trainer.max_steps later "
            "to anneal from step 100)") in first.stderr
    assert second.returncode == 0, second.stderr[-3000:]
    assert ("resumes after step 100 of 150 (trained so far for trainer.max_steps=100): decay from step 100, where "
            "the stable phase trained so far ends; step 101 trains at 0.002618 (step 100 trained at 0.003)"
            in second.stderr), second.stderr[-3000:]
    assert whole.returncode == 0, whole.stderr[-3000:]

    extended, uninterrupted = _rows(run_root / "extended"), _rows(run_root / "whole")
    assert len(extended) == len(uninterrupted) == 150
    # Float equality: bitwise, for the 100 steps of the first run and the 50 of the extension alike.
    assert {k: r["loss"] for k, r in extended.items()} == {k: r["loss"] for k, r in uninterrupted.items()}
    rates = _closed_form(Schedule("wsd", 150, WARMUP, FLOOR, decay_start_step=100), range(1, 151))
    assert {k: r["lr"] for k, r in extended.items()} == rates == {k: r["lr"] for k, r in uninterrupted.items()}
    assert rates[100] == PEAK > rates[101] and rates[150] == pytest.approx(FLOOR * PEAK)  # stable, then annealed


def test_an_extended_cosine_run_does_what_the_plan_said(run_root: Path) -> None:
    common = _common(run_root, "run.name=cosine")
    first = launch(*common, "trainer.max_steps=20")
    assert first.returncode == 0, first.stderr[-3000:]
    second = launch(*common, "trainer.max_steps=30")
    assert second.returncode == 0, second.stderr[-3000:]
    said = re.search(r"resumes after step 20 of 30 \(trained so far for trainer.max_steps=20\): cosine decay "
                     r"re-stretched to end at step 30 \(was 20\); step 21 trains at (\S+) \(step 20 trained at (\S+)\)",
                     second.stderr)
    assert said, second.stderr[-3000:]

    rows = _rows(run_root / "cosine")
    assert len(rows) == 30
    assert rows[21]["lr"] == pytest.approx(float(said.group(1)), rel=1e-3)
    assert rows[20]["lr"] == pytest.approx(float(said.group(2)), rel=1e-3)
    # Steps 1-20 on the 20-step cosine, every step of the extension on the 30-step one: no step at the old rate.
    old = _closed_form(Schedule("cosine", 20, WARMUP, FLOOR), range(1, 21))
    new = _closed_form(Schedule("cosine", 30, WARMUP, FLOOR), range(21, 31))
    assert {k: r["lr"] for k, r in rows.items()} == old | new
    assert rows[21]["lr"] > 3 * rows[20]["lr"]  # re-stretched: the rate climbs back up the longer curve
