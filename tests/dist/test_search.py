"""A hyperparameter search on this machine (no cluster): local worker processes, pruning at the first rung, a USR1
in mid-trial, status and report. The tiny model, 30 steps a trial."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from contract.errors import EXIT_STOPPED
from contract.rundir.events import read_events
from contract.search import layout
from contract.search.optuna_objects import load_study
from launcher.sweeps.search_worker import TEST_SEARCH_SIGNAL_ENV
from tests.conftest import hq, launch

pytestmark = pytest.mark.dist

STEPS, EVERY = 30, 5
COMMON = [f"trainer.max_steps={STEPS}", f"eval.every={EVERY}", "logger.backend=none", "telemetry.enabled=false"]


def search(root: Path, name: str, *args: str, **env: str):  # type: ignore[no-untyped-def]
    return launch("-m", "hydra/sweeper=search", *args, *COMMON, f"run.root={hq(root)}",
                  f"launcher.sweep_name={name}", cwd=root, timeout=900, **env)


def trials(sweep_dir: Path) -> list:  # type: ignore[type-arg]
    return load_study(sweep_dir, layout.load_spec(sweep_dir)).get_trials(deepcopy=False)


def reports(sweep_dir: Path) -> Counter[tuple[int, int]]:
    """(trial id, step) of every intermediate value the journal recorded, counted: each must be there once."""
    ops = [json.loads(line) for line in (sweep_dir / layout.JOURNAL_FILE).read_text().splitlines() if line.strip()]
    return Counter((op["trial_id"], op["step"]) for op in ops if "intermediate_value" in op)


def test_lr_search_prunes_hopeless_trials_at_the_first_rung(run_root: Path) -> None:
    """Acceptance 1, 4 and 5: 12 trials, ASHA, 3 local workers. The grid (no pruning) says which lr is best."""
    grid = search(run_root, "grid", "optim.lr=choice(1e-4,1e-3,1e-2,1e-1,1)", "search.sampler=grid",
                  "search.pruner=none", "search.parallel=3")
    assert grid.returncode == 0, grid.stderr[-3000:]
    done = [t for t in trials(run_root / "sweeps" / "grid") if t.state.name == "COMPLETE"]
    assert len(done) == 5
    grid_best = min(done, key=lambda t: t.value).params["optim.lr"]

    out = search(run_root, "lr", "optim.lr=tag(log,interval(1e-5,1))", "search.n_trials=12", "search.parallel=3",
                 "search.pruner=asha")
    assert out.returncode == 0, out.stderr[-3000:]
    sweep_dir = run_root / "sweeps" / "lr"
    ts = trials(sweep_dir)
    assert len(ts) == 12 and sorted(t.number for t in ts) == list(range(12))
    assert {t.state.name for t in ts} <= {"COMPLETE", "PRUNED"}
    steps = {t.number: t.user_attrs["steps"] for t in ts}
    for t in ts:
        lr = t.params["optim.lr"]
        if lr >= 10 * grid_best or lr <= grid_best / 100:  # diverging, or all but frozen
            assert t.state.name == "PRUNED" and steps[t.number] == EVERY < STEPS / 3, (lr, t.state, steps[t.number])
            pruned = read_events(Path(t.user_attrs["run_dir"]))[-1]
            assert pruned["kind"] == "pruned" and pruned["rule"], pruned  # which rule pruned it, said
            assert pruned["rule"] in ("its metric is NaN", "search.pruner=asha (Optuna's SuccessiveHalvingPruner)") or \
                pruned["rule"].startswith("not 1% better than its step-0 value"), pruned
    best = min((t for t in ts if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert steps[best.number] == STEPS
    assert abs(math.log10(best.params["optim.lr"] / grid_best)) <= 1, (best.params, grid_best)
    print(f"grid best lr {grid_best:g}; search best trial {best.number} lr {best.params['optim.lr']:.3g}; steps "
          f"{sum(steps.values())} of {12 * STEPS}; pruned {sum(t.state.name == 'PRUNED' for t in ts)} of 12")
    assert sum(steps.values()) <= 0.7 * 12 * STEPS, steps
    assert max(reports(sweep_dir).values()) == 1

    # Acceptance 5: status lists every trial and the best; report draws one line per trial.
    status = launch_module("launcher.status", sweep_dir)
    assert status.returncode == 0, status.stderr
    for t in ts:
        assert f"│ {t.number} " in status.stdout or f"┃ {t.number} " in status.stdout
    assert f"best so far: trial {best.number} " in status.stdout and "GPU-hours used" in status.stdout
    report = launch_module("launcher.report", sweep_dir)
    assert report.returncode == 0, report.stderr
    from PIL import Image

    png = Image.open(sweep_dir / "search.png")
    lines = json.loads(png.text["Description"])["lines"]
    assert sorted(lines) == sorted(f"trial-{t.number}" for t in ts)
    assert (sweep_dir / "importances.png").is_file()
    # The best trial's run directory is a normal run: its own status works.
    one = launch_module("launcher.status", Path(best.user_attrs["run_dir"]))
    assert one.returncode == 0 and "finished" in one.stdout
    exported = launch_module("launcher.export", Path(best.user_attrs["run_dir"]))
    assert exported.returncode == 0, exported.stderr[-2000:]


def launch_module(module: str, *args: object):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from tests.conftest import launcher_env

    return subprocess.run([sys.executable, "-m", module, *map(str, args)], env=launcher_env(), capture_output=True,
                           text=True, timeout=300)


def test_usr1_mid_trial_resumes_it_and_the_study_is_the_same(run_root: Path) -> None:
    """Acceptance 2: one worker (deterministic), trial 0 gets USR1 at its step 12 (sent to the worker, which forwards
    it): the trial checkpoints, the same command resumes it, every value is reported once, and the study equals the
    one of the same search without the signal."""
    args = ["optim.lr=tag(log,interval(1e-4,1e-1))", "search.n_trials=2", "search.pruner=asha",
            "trainer.ckpt_every=10"]
    plain = search(run_root, "plain", *args)
    assert plain.returncode == 0, plain.stderr[-3000:]
    first = search(run_root, "signalled", *args, **{TEST_SEARCH_SIGNAL_ENV: "0:12"})
    assert first.returncode == EXIT_STOPPED, first.stderr[-3000:]
    sweep_dir = run_root / "sweeps" / "signalled"
    assert [t.state.name for t in trials(sweep_dir)] == ["RUNNING"]
    again = search(run_root, "signalled", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    run_dir = layout.trial_dir(sweep_dir, 0)
    kinds = [e["kind"] for e in read_events(run_dir)]
    assert kinds == ["stopped", "finished"], kinds
    assert "resumed from" in (run_dir / "logs" / "rank_0.log").read_text()
    assert max(reports(sweep_dir).values()) == 1
    a, b = trials(run_root / "sweeps" / "plain"), trials(sweep_dir)
    assert [(t.number, t.params, t.state) for t in a] == [(t.number, t.params, t.state) for t in b]
    for x, y in zip(a, b, strict=True):
        assert sorted(x.intermediate_values) == sorted(y.intermediate_values)
        assert x.intermediate_values == pytest.approx(y.intermediate_values, rel=1e-5)


def test_a_crashed_trial_is_failed_with_its_reason_and_the_worker_goes_on(run_root: Path) -> None:
    args = ["optim.lr=tag(log,interval(1e-3,1e-2))", "search.n_trials=2", "search.pruner=none"]
    out = search(run_root, "crash", *args, SLURMTRAIN_TEST_RAISE="0:3", SLURMTRAIN_TEST_ONLY_IN="trial_0001")
    assert out.returncode == 0, out.stderr[-3000:]
    sweep_dir = run_root / "sweeps" / "crash"
    ts = trials(sweep_dir)
    assert [t.state.name for t in ts] == ["COMPLETE", "FAIL"]
    assert "injected failure on rank 0 at step 3" in ts[1].user_attrs["reason"]
    status = launch_module("launcher.status", sweep_dir, "--json")
    rows = json.loads(status.stdout)["rows"]
    assert rows[1]["state"] == "failed" and "injected failure" in rows[1]["reason"]
    # The budget: raising n_trials continues the study, but the GPU-hours are spent: no new trial, nothing trained.
    more = search(run_root, "crash", *args, "search.n_trials=4", "search.max_gpu_hours=1e-9")
    assert more.returncode == 0, more.stderr[-3000:]
    assert "search.max_gpu_hours=1e-09 used: no new trial" in more.stderr
    assert len(trials(sweep_dir)) == 2
