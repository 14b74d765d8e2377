"""What `launcher.status` and `launcher.report` say of a search (issue 48, items 2, 5, 8, 9, 10): the GPU-hours had
every trial run to the end, the state of a trial the study holds as RUNNING, a search with no best, --json's rows and
total, and search.png's axes. Studies are built here, with fake clocks in the metrics rows; no trial trains."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from contract.rundir import ckpt_layout
from contract.search import layout
from contract.search.optuna_objects import create_study, distributions, load_study


def lr_search(sweep_dir: Path, n_trials: int = 3, ranks: int = 1) -> layout.SearchSpec:
    spec = layout.SearchSpec(
        study_name="s", storage="", params={"optim.lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True}},
        overrides=[], metric="val/val/loss", higher_is_better=False, pruner={"name": "none", "min_resource": 10},
        sampler={"name": "random", "seed": 0}, n_trials=n_trials, parallel=1, max_gpu_hours=None, timeout=None,
        max_steps=400, ranks=ranks, cwd=str(sweep_dir), command="", created=time.time())
    sweep_dir.mkdir(parents=True, exist_ok=True)
    layout.save_spec(sweep_dir, spec)
    create_study(sweep_dir, spec)
    return spec


def write_rows(run_dir: Path, times: dict[int, float]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "time": 1e9 + t, "loss": 1.0}) + "\n"
                                                   for k, t in times.items()))


def stopped_at(run_dir: Path, step: int, when: float) -> None:
    """A clean stop recorded at `when` (fake clock), with its complete checkpoint."""
    with open(run_dir / "events.jsonl", "a") as f:
        f.write(json.dumps({"time": 1e9 + when, "kind": "stopped", "attempt": 0, "step": step}) + "\n")
    ckpt_layout.step_dir(run_dir, step).mkdir(parents=True)
    ckpt_layout.write_marker(ckpt_layout.step_dir(run_dir, step))


def add_trial(sweep_dir: Path, spec: layout.SearchSpec, how: TrialState | None, **attrs: object) -> int:
    study = load_study(sweep_dir, spec)
    trial = study.ask(distributions(spec))
    attrs = {"run_dir": str(layout.trial_dir(sweep_dir, trial.number)), "max_steps": spec.max_steps,
             "ranks": spec.ranks, "seconds": 0.0, "steps": 0, **attrs}
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    trial.report(2.0, 10)
    if how == TrialState.COMPLETE:
        study.tell(trial.number, 1.5)
    elif how is not None:
        study.tell(trial.number, state=how)
    return trial.number


def test_a_restart_between_two_logged_rows_is_no_steps_time(tmp_path: Path) -> None:
    """Item 2: a trial stopped after its step-20 row and resumed 55 s later logs step 30 next; the pair 20 -> 30 holds
    the restart. With only two pairs, their median was their mean: 3 s a step instead of 0.5."""
    from contract.search.progress import steady_step_seconds

    write_rows(tmp_path, {10: 40.0, 20: 45.0, 30: 105.0})
    stopped_at(tmp_path, 20, 46.0)
    assert steady_step_seconds(tmp_path) == pytest.approx(0.5)


def test_a_trial_with_no_pace_of_its_own_goes_at_the_others_pace(tmp_path: Path) -> None:
    """Item 2: a trial interrupted before its second logged row had 41 s (mostly start-up) for 10 steps: its 390
    steps left counted at 4.1 s a step, ~20x the 0.03 s the trials step at. They go at the other trials' pace."""
    from launcher.sweeps.search_status import collect

    spec = lr_search(tmp_path, ranks=2)
    add_trial(tmp_path, spec, TrialState.COMPLETE, seconds=30.0, steps=400, step_s=0.03)
    add_trial(tmp_path, spec, TrialState.PRUNED, seconds=41.0, steps=10)
    summary = collect(tmp_path)
    assert summary.gpu_hours == pytest.approx((30.0 + 41.0) * 2 / 3600)
    assert summary.gpu_hours_to_end == pytest.approx((30.0 + 41.0 + 390 * 0.03) * 2 / 3600)  # not 41 x 40 for one


def test_status_tells_a_stopped_trial_and_a_requeued_worker_from_a_running_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 5: after a Ctrl-C every RUNNING trial read `running`: one checkpointed and stopped, one whose worker was
    requeued and still pends, and the one really training showed 0/400 steps with values reported at step 10."""
    from contract.rundir import accounting
    from launcher.sweeps.search_status import collect

    spec = lr_search(tmp_path)
    stopped = add_trial(tmp_path, spec, None, seconds=20.0, steps=20)
    pending = add_trial(tmp_path, spec, None)
    training = add_trial(tmp_path, spec, None)
    write_rows(layout.trial_dir(tmp_path, stopped), {10: 1.0, 20: 2.0})
    stopped_at(layout.trial_dir(tmp_path, stopped), 20, 3.0)
    layout.write_json(layout.worker_file(tmp_path, 0), {"trial": stopped, "pid": 2 ** 22 + 1, "host": "gone-host",
                                                        "job": None})
    layout.write_json(layout.worker_file(tmp_path, 1), {"trial": pending, "pid": 1, "host": "n1", "job": "181_1"})
    write_rows(layout.trial_dir(tmp_path, training), {10: 1.0, 20: 2.0, 30: 3.0})
    layout.write_json(layout.worker_file(tmp_path, 2), {"trial": training, "pid": os.getpid(),
                                                        "host": socket.gethostname(), "job": None})
    monkeypatch.setattr(accounting, "queue_state", lambda job: "PENDING" if job == "181_1" else "")
    rows = {r.number: r for r in collect(tmp_path).trials}
    assert rows[stopped].state == "stopped" and "checkpointed at step 20" in rows[stopped].reason
    assert rows[pending].state == "pending" and "181_1 is queued again" in rows[pending].reason
    assert rows[training].state == "running" and rows[training].steps == 30
    assert rows[training].step_s == pytest.approx(0.1)


def test_status_says_every_trial_was_pruned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 8: a search whose trials were all pruned ended with 'best so far: none (no trial complete yet)'."""
    from launcher.sweeps.search_status import print_status

    spec = lr_search(tmp_path, n_trials=2)
    for _ in range(2):
        add_trial(tmp_path, spec, TrialState.PRUNED, seconds=5.0, steps=10)
    print_status(tmp_path)
    out = capsys.readouterr().out
    assert "no trial completed with a finite val/val/loss (2 pruned): there is no best; every trial was pruned" in out
    assert "search.min_improvement=0" in out


def test_status_json_has_rows_and_total(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: docs/telemetry.md says `--json` prints {"rows": [...], "total": {...}}; a search's had neither."""
    from launcher.sweeps.search_status import print_status

    spec = lr_search(tmp_path)
    add_trial(tmp_path, spec, TrialState.COMPLETE, seconds=30.0, steps=400, step_s=0.03)
    add_trial(tmp_path, spec, TrialState.PRUNED, seconds=5.0, steps=10)
    print_status(tmp_path, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in out["rows"]] == ["complete", "pruned"] and out["rows"][1]["steps"] == 10
    assert out["total"]["states"] == {"complete": 1, "pruned": 1} and out["total"]["trials"] == 2
    assert out["total"]["steps"] == 410 and out["best"]["number"] == 0


def _labels(axis) -> list[str]:  # type: ignore[no-untyped-def]
    """The tick labels drawn inside the axis's range."""
    low, high = axis.get_view_interval()
    ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
    return [t.label1.get_text() for t in ticks if t.label1.get_visible() and t.label1.get_text()
            and low <= t.get_loc() <= high]


@pytest.mark.parametrize("values", [[2.31, 2.27, 2.24, 2.22], [1.14, 1.10, 1.08, 1.06, 30.0]],
                         ids=["within a decade", "one trial diverged"])
def test_search_png_labels_its_axes_as_plain_numbers(values: list[float]) -> None:
    """Item 9: the log y axis labelled only 3x10^0 and 4x10^0; the best-so-far panel was empty without a word while
    no trial was complete; its trial axis had half-trial ticks."""
    from launcher.sweeps.search_report import search_figure
    from launcher.sweeps.search_status import Summary, TrialRow

    trials = [TrialRow(number=i, params={}, state="running", value=v, steps=10 * (i + 1), max_steps=100,
                       seconds=1.0, ranks=1, run_dir="", values={10 * (k + 1): v for k in range(i + 1)})
              for i, v in enumerate(values)]
    fig = search_figure(Summary(trials, None, "val/val/loss", False, 4, 0.0, 0.0, 0, 0), "s")
    fig.canvas.draw()
    ax, ax_best = fig.axes
    labels = _labels(ax.yaxis)
    assert len(labels) >= 3 and all(float(text.replace("\u2212", "-")) for text in labels), labels
    inside = [float(t) for t in labels if min(values) <= float(t) <= max(values)]
    assert inside, labels  # a labelled value among the trials' own
    assert "no trial complete yet" in [t.get_text() for t in ax_best.texts]
    ax_best.set_xlim(-0.5, 2.5)
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in _labels(ax_best.xaxis)), _labels(ax_best.xaxis)


def test_status_counts_the_trials_not_started_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The new-user re-trial: a search of 3 trials cancelled after its first said '1 of 3 trials' and 'GPU-hours used
    0.0066 of 0.0066 had every trial run to the end; steps 150 of 150', silent on the two it still owed."""
    from launcher.sweeps.search_status import collect, print_status

    spec = lr_search(tmp_path, n_trials=3, ranks=2)
    add_trial(tmp_path, spec, TrialState.COMPLETE, seconds=36.0, steps=400, step_s=0.09)
    summary = collect(tmp_path)
    assert summary.not_started == 2 and summary.steps_all == 3 * 400
    assert summary.gpu_hours_all == pytest.approx(3 * 36.0 * 2 / 3600)
    print_status(tmp_path)
    out = capsys.readouterr().out
    assert "steps 400 of 400" in out
    assert "2 of the search's 3 trials not started yet (about 0.06 GPU-hours and 1200 steps with them): the same " \
           "search command runs them" in out
    print_status(tmp_path, as_json=True)
    total = json.loads(capsys.readouterr().out)["total"]
    assert total["not_started"] == 2 and total["steps_all_trials"] == 1200


def test_search_png_of_a_search_with_no_best_says_why_and_draws_no_ticks(tmp_path: Path) -> None:
    """The re-trial: every trial pruned, the empty panel said 'no trial complete yet' over ticks -0.045 ... 0.045, and
    the left panel's values, within 5e-6 of each other, read as ticks 80-85 under an offset '1e-6+5.5491'."""
    from launcher.sweeps.search_report import search_figure
    from launcher.sweeps.search_status import Summary, TrialRow

    values = [5.549181, 5.549183, 5.549184]
    trials = [TrialRow(number=i, params={}, state="pruned", value=v, steps=20, max_steps=100, seconds=1.0, ranks=1,
                       run_dir="", values={0: v + 1e-6, 20: v}) for i, v in enumerate(values)]
    fig = search_figure(Summary(trials, None, "val/val/loss", False, 3, 0.0, 0.0, 0, 0), "s")
    fig.canvas.draw()
    ax, ax_best = fig.axes
    assert ax.yaxis.get_offset_text().get_text() == ""
    assert all(5.5 < float(t.replace("\u2212", "-")) < 5.6 for t in _labels(ax.yaxis)), _labels(ax.yaxis)
    note = " ".join(t.get_text() for t in ax_best.texts)
    assert "no trial completed with a finite val/val/loss" in note and "3 pruned" in note, note
    assert _labels(ax_best.xaxis) == [] and _labels(ax_best.yaxis) == []
    assert all(float(t).is_integer() for t in _labels(ax.xaxis)), _labels(ax.xaxis)  # no 2.5, 7.5 ... steps
