"""Exact resume with the stability checks on (issue 22): what their decisions depend on is in each checkpoint.

One run trained straight through, and the same run stopped twice and resumed, on 2 gloo ranks with the spike rule
(a window of 8) and stability.skip_limit=2:

    step 16     the first attempt stops (a preemption) and checkpoints
    step 18     a spike batch: flagged only with the window the first attempt built (a fresh one holds 1 value)
    step 22     rank 1's gradients are NaN, skipped; the second attempt stops there and checkpoints
    step 23     NaN again: 2 in a row with step 22 of the attempt before, so the run rolls back to step 20 and skips
                the samples of steps 22-23 (whose first position the attempt before recorded)
    step 25     a spike batch, first trained after the rollback: flagged only with the window of checkpoint 20

Losses, skipped steps, rollbacks and the logged counts must be the uninterrupted run's, bitwise."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from contract.errors import EXIT_STOPPED
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist

FIRST_STOP, SECOND_STOP = 16, 22
SPIKES, NANS = (18, 25), (22, 23)
GLOBAL_BATCH = 16  # 2 ranks x micro batch 8: step s reads samples [16 (s - 1), 16 s)
COMMON = ["trainer.log_every=1", "logger.backend=none", "trainer.progress_bar=false", "local.nproc=2",
          "trainer.max_steps=28", "trainer.ckpt_every=4", "stability.nonfinite=skip", "stability.skip_limit=2",
          "stability.spike_sigma=6", "stability.spike_window=8"]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _faults(*, spikes: tuple[int, ...] = (), nans: tuple[int, ...] = (), stop: int | None = None) -> dict[str, str]:
    """The injectors of one attempt: each fires at its step's first training in that process (and again where the
    same samples come back), so an attempt gets only those of the steps it trains first."""
    env = {"SLURMTRAIN_TEST_SPIKE_BATCH": ",".join(map(str, spikes)),
           "SLURMTRAIN_TEST_NAN_GRAD": ",".join(f"{s}:1" for s in nans)}
    if stop is not None:
        env["SLURMTRAIN_TEST_SIGNAL"] = f"{stop}:0"
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("stability_resume") / "runs"
    root.mkdir()
    with ThreadPoolExecutor(1) as pool:
        whole = pool.submit(launch, *COMMON, f"run.root={hq(root)}", "run.name=whole",
                            **_faults(spikes=SPIKES, nans=NANS))
        split = [launch(*COMMON, f"run.root={hq(root)}", "run.name=split", **faults) for faults in (
            _faults(stop=FIRST_STOP),
            _faults(spikes=SPIKES[:1], nans=NANS[:1], stop=SECOND_STOP),
            _faults(spikes=SPIKES[1:], nans=NANS[1:]))]
        yield {"root": root, "whole": whole.result(), "split": split}


def test_the_attempts_end_as_planned(runs: dict[str, Any]) -> None:
    assert runs["whole"].returncode == 0, runs["whole"].stderr[-3000:]
    assert [p.returncode for p in runs["split"]] == [EXIT_STOPPED, EXIT_STOPPED, 0], runs["split"][-1].stderr[-3000:]


def test_the_spikes_after_a_resume_and_after_a_rollback_are_skipped_as_in_the_uninterrupted_run(
        runs: dict[str, Any]) -> None:
    skipped = {n: [(e["step"], e["reason"]) for e in _events(runs["root"] / n) if e["kind"] == "skipped_step"]
               for n in ("whole", "split")}
    assert {(s, "spike") for s in SPIKES} | {(s, "nonfinite") for s in NANS} <= set(skipped["whole"])
    assert skipped["split"] == skipped["whole"]


def test_a_run_of_skipped_steps_across_a_resume_rolls_back_as_in_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    rollbacks = {n: [(e["step"], e["to_step"], e["skipped"]) for e in _events(runs["root"] / n)
                     if e["kind"] == "rollback"] for n in ("whole", "split")}
    first, last = NANS
    assert rollbacks["whole"] == [(last, 20, [[(first - 1) * GLOBAL_BATCH, last * GLOBAL_BATCH]])]
    assert rollbacks["split"] == rollbacks["whole"]


def test_losses_and_counts_are_bitwise_those_of_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    rows = {n: read_metrics(runs["root"] / n) for n in ("whole", "split")}
    fields = ("step", "loss", "grad_norm", "skipped_steps", "spikes")
    # repr: a skipped step's gradient norm is NaN, which equals nothing, itself included
    whole, split = ([repr(tuple(r[f] for f in fields)) for r in rows[n]] for n in ("whole", "split"))
    assert [r["step"] for r in rows["whole"]] == list(range(1, 29))
    assert split == whole
