"""The preemption turnaround benchmark's arithmetic, from fabricated observations of one job (nothing submitted)."""

from __future__ import annotations

import pytest

from bench.preemption_turnaround import BenchError, figures, report, turnaround
from bench.report import rows_of

T = 1_800_000_000.0  # the signal


def _rows(steps: range, first_time: float, step_s: float = 0.1) -> list[dict]:
    return [{"step": s, "time": first_time + (i * step_s), "loss": 1.0} for i, s in enumerate(steps)]


def observations(resumed_step: int = 23) -> dict:
    before = _rows(range(1, 24), T - 2.0)  # step 1 at T-2.0 ... step 21 at T, 22 and 23 after the signal
    after = [r for r in before if r["step"] <= resumed_step] + _rows(range(resumed_step + 1, 81), T + 30.0)
    return {
        "job": "7", "t_signal": T, "pending_seen": T + 5.0, "running_seen": T + 5.5,
        "rows_before": before, "rows": after, "resumed_step": resumed_step,
        "events": [
            {"time": T + 0.6, "kind": "preempted", "attempt": 0, "job": "7", "step": 23, "steps_lost": 0,
             "started": T - 14.0, "ended": T + 0.6},
            {"time": T + 40.0, "kind": "finished", "attempt": 1, "job": "7", "step": 80, "steps_lost": 0,
             "started": T + 6.5, "ended": T + 40.0},
        ],
        "marker": {"time": T + 0.5, "step": 23, "world_size": 2},
        "watchdog": {"longest_s": {"step": 0.2, "checkpoint": 0.25}, "observations": {"step": 23, "checkpoint": 1}},
    }


def test_turnaround_of_a_preempted_and_resumed_job() -> None:
    f = turnaround(observations())
    assert (f["signal_step"], f["stop_step"], f["resumed_step"], f["steps_after_signal"]) == (21, 23, 23, 2)
    assert f["steps_lost"] == 0
    assert f["signal_to_checkpoint_s"] == pytest.approx(0.5)
    assert f["save_s"] == 0.25
    assert f["signal_to_requeue_s"] == pytest.approx(0.6)
    assert f["requeue_to_restart_s"] == pytest.approx(5.9)
    assert (f["requeue_to_pending_s"], f["pending_s"], f["launch_s"]) == pytest.approx((4.4, 0.5, 1.0))
    assert f["restart_to_first_step_s"] == pytest.approx(23.5)  # step 24 at T+30, the process started at T+6.5
    assert f["start_to_first_step_s"] == pytest.approx(12.0)  # step 1 at T-2, the first attempt started at T-14


def test_steps_lost_counts_what_the_first_attempt_did_past_the_step_resumed_from() -> None:
    f = turnaround(observations(resumed_step=20))  # resumed from an older checkpoint than the stop step 23
    assert f["steps_lost"] == 3
    # The product's own count, settled on resume, wins when it says more (e.g. rows lost with a torn file).
    obs = observations()
    obs["events"][0]["steps_lost"] = 2
    assert turnaround(obs)["steps_lost"] == 2


def test_a_save_time_is_only_used_when_the_stop_save_was_the_only_one_timed() -> None:
    obs = observations()
    obs["watchdog"]["observations"]["checkpoint"] = 2
    assert turnaround(obs)["save_s"] is None


def test_observations_that_do_not_fit_a_preemption_are_refused() -> None:
    obs = observations()
    obs["events"] = obs["events"][:1]  # the resumed attempt never ended
    with pytest.raises(BenchError, match="preempted attempt followed by another"):
        turnaround(obs)
    obs = observations()
    obs["marker"]["step"] = 22
    with pytest.raises(BenchError, match="not the stop step"):
        turnaround(obs)


def test_figures_and_report_line() -> None:
    reps = [turnaround(observations()), turnaround(observations(resumed_step=20))]
    result = {"repeats": 2, "quick": False, "repetitions": reps, "steps_lost": 3,
              "median": {k: sorted(r[k] for r in reps)[0] for k in reps[0] if k != "job"},
              "checkpoint_vs_save": 2.0, "restart_vs_fresh_start": 23.5 / 12.0}
    rows = {r["figure"]: r for r in rows_of("preemption_turnaround", result)}
    assert rows["signal -> stop checkpoint complete"]["value"] == 2.0
    lost = rows["steps lost to a preemption"]
    assert (lost["value"], lost["target"], lost["met"]) == (3.0, "<= 0", False)
    assert rows["restart -> first resumed step"]["value"] == pytest.approx(1.958, abs=1e-3)
    assert rows["pending in the queue after the requeue (s)"]["value"] == pytest.approx(0.5)
    assert all(set(r) >= {"figure", "value", "baseline", "target", "met", "detail"} for r in figures(result))
    line = report(result)
    assert "steps lost 3 (target 0)" in line and "= 2.00x the 0.25 s save" in line
    assert report({"skipped": "no local SLURM cluster (make slurm-up)", "target_met": True}) == (
        "preemption turnaround: skipped (no local SLURM cluster (make slurm-up))")
