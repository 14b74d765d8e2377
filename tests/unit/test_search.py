"""A search's checks before anything runs (acceptance 6), its plan's worst case, and the search space's reading of
Hydra's sweep syntax. No trial trains here (tests/dist/test_search.py, tests/slurm/test_search.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.errors import ConfigError
from launcher.sweeps.search_space import grid_values, parse
from tests.conftest import hq, launch

BAD = [
    (["optim.lrr=tag(log,interval(1e-5,1))", "eval.every=5"], "optim.lrr is not a slurmtrain key: did you mean optim.lr?"),
    (["optim.lr=interval(1,1e-5)", "eval.every=5"], "an empty interval"),
    (["optim.lr=tag(log,interval(1e-5,1))", "search.pruner=asha"], "set eval.every=N"),
    (["optim.lr=tag(log,interval(1e-5,1))", "eval.every=5", "search.n_trials=0"], "search.n_trials=0"),
    (["optim.warmup_steps=interval(0,10)", "eval.every=5"],
     "optim.warmup_steps is an integer and interval() samples floats: search it with range(0,11)"),
    # a misspelled tag was ignored (a uniform search where log-uniform was meant)
    (["optim.lr=tag(lg,interval(1e-5,1))", "eval.every=5"], "a search reads one tag, log, on an interval"),
    # a traceback, then 'the command line could not be read', and the sweep directory left behind
    (["optim.lr=tag(log,interval(1e-5,1))", "eval.every=5", "search.storage=foo://bar"],
     "search.storage=foo://bar is no RDB URL SQLAlchemy can open"),
    # accepted, and nothing was ever pruned
    (["optim.lr=tag(log,interval(1e-5,1))", "eval.every=5", "search.min_resource=100", "trainer.max_steps=10",
      "cluster.nodes=1"],
     "first prunes at step 100 (search.min_resource, else eval.every), and a trial trains 10 steps"),
    # the plan said 10 steps a trial and status showed 20/10
    (["trainer.max_steps=choice(10,20)", "optim.lr=choice(1e-3,1e-2)", "eval.every=5"],
     "trainer.max_steps is what every trial's length is measured by"),
    # the fixed value was dropped without a word
    (["optim.lr=choice(1e-3,1e-2)", "optim.lr=1e-4", "eval.every=5"],
     "optim.lr is searched and also given as optim.lr=1e-4: drop one of them"),
    # the search's own setting was attributed to "the search's trial (optim.lr=1e-05)"
    (["optim.lr=tag(log,interval(1e-5,1))", "eval.every=5", "search.timeout=-5", "cluster.nodes=1"],
     "error: search.timeout=-5 is out of range"),
]


@pytest.mark.parametrize(("args", "words"), BAD, ids=["unknown key", "empty interval", "no eval.every", "no trials",
                                                          "interval of an int", "unknown tag", "bad storage",
                                                          "nothing to prune", "length searched", "searched and fixed",
                                                          "the search's own setting"])
def test_bad_input_is_one_line_exit_2_and_nothing_created(tmp_path: Path, args: list[str], words: str) -> None:
    root = tmp_path / "runs"
    out = launch("-m", "hydra/sweeper=search", *args, f"run.root={hq(root)}", "+cluster=local_slurm", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert not root.exists()  # no sweep directory, no study, nothing submitted (it would be recorded there)


def test_dry_run_prints_the_worst_case_and_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    out = launch("-m", "hydra/sweeper=search", "optim.lr=tag(log,interval(1e-5,1))", "optim.warmup_steps=choice(2,5)",
                 "eval.every=5", "trainer.max_steps=30", "search.n_trials=12", "search.parallel=3",
                 "search.pruner=asha", "+cluster=local_slurm", "cluster.nodes=1", "launcher.dry_run=true", f"run.root={hq(root)}",
                 "search.timeout=3600", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "12 trials over optim.lr, optim.warmup_steps, 3 worker(s), sampler tpe, pruner asha" in out.stderr
    assert "worst case (no trial pruned): 12 x 30 = 360 steps" in out.stderr
    assert "stops taking trials search.timeout=3600 s after it started" in out.stderr  # the plan said nothing of it
    # The plan is one trial's, at the space's first corner: its lr 1e-05 read as the run's (issue 48 item 10).
    assert "plan of one trial, at the space's first corner (optim.lr=1e-05 optim.warmup_steps=2; each trial draws " \
           "its own values of these)" in out.stderr
    assert "space: optim.lr log-uniform 1e-05 to 1, optim.warmup_steps one of 2, 5" in out.stderr
    assert "dry run: nothing created or submitted" in out.stderr
    assert not root.exists()


def test_space_reads_hydra_optuna_sweeper_syntax() -> None:
    space = parse(["optim.lr=tag(log,interval(1e-5,1e-1))", "optim.warmup_steps=choice(50,200,800)",
                   "trainer.seed=range(1,4)", "trainer.max_steps=30", "+cluster=local_slurm"])
    assert space.params["optim.lr"] == {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}
    assert space.params["optim.warmup_steps"] == {"type": "categorical", "choices": [50, 200, 800]}
    assert space.params["trainer.seed"] == {"type": "int", "low": 1, "high": 3, "step": 1, "log": False}
    assert space.fixed == ["trainer.max_steps=30", "+cluster=local_slurm"]
    assert grid_values(parse(["a.b=choice(1,2)", "c.d=range(0,6,2)"])) == {"a.b": [1, 2], "c.d": [0, 2, 4]}
    with pytest.raises(ConfigError, match="continuous"):
        grid_values(space)
    with pytest.raises(ConfigError, match="needs a parameter to search"):
        parse(["trainer.max_steps=30"])
    with pytest.raises(ConfigError, match="log interval needs LOW > 0"):
        parse(["optim.lr=tag(log,interval(0,1))"])


def test_a_worker_takes_no_new_trial_once_the_budget_is_spent(tmp_path: Path) -> None:
    import time
    from types import SimpleNamespace

    from contract.search import layout
    from launcher.sweeps.search_worker import Worker

    spec = layout.SearchSpec(
        study_name="s", storage="", params={}, overrides=[], metric="val/val/loss", higher_is_better=False,
        pruner={"name": "none", "min_resource": 5}, sampler={"name": "tpe", "seed": 0}, n_trials=3, parallel=1,
        max_gpu_hours=None, timeout=None, max_steps=30, ranks=2, cwd=str(tmp_path), command="", created=time.time())
    layout.save_spec(tmp_path, spec)
    worker = Worker(tmp_path, 0)
    half_hour = SimpleNamespace(user_attrs={"seconds": 1800.0, "ranks": 2})  # 1 GPU-hour
    assert worker.budget_left([half_hour, half_hour])
    assert not worker.budget_left([half_hour] * 3)  # n_trials
    worker.spec.max_gpu_hours = 2.5
    assert worker.budget_left([half_hour, half_hour]) and not worker.budget_left([half_hour] * 3)
    worker.spec.max_gpu_hours, worker.spec.n_trials = 2.0, 10
    assert not worker.budget_left([half_hour, half_hour])
    worker.spec.max_gpu_hours, worker.spec.timeout = None, 60.0
    assert worker.budget_left([])
    worker.spec.created -= 61
    assert not worker.budget_left([])


def test_an_rdb_storage_keeps_two_searches_apart(tmp_path: Path) -> None:
    """search.storage=sqlite:///...: one database, two sweep directories of the same name, two studies."""
    import time

    from contract.search import layout
    from contract.search.optuna_objects import create_study, load_study

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    for root in ("a", "b"):
        sweep_dir = tmp_path / root / "sweeps" / "lr"
        spec = layout.SearchSpec(
            study_name=layout.study_name(sweep_dir), storage=url, params={},
            overrides=[], metric="val/val/loss", higher_is_better=False,
            pruner={"name": "median", "min_resource": 5}, sampler={"name": "random", "seed": 0}, n_trials=1,
            parallel=1, max_gpu_hours=None, timeout=None, max_steps=30, ranks=1, cwd=str(tmp_path), command="",
            created=time.time())
        create_study(sweep_dir, spec)
        load_study(sweep_dir, spec).enqueue_trial({})
    import optuna

    names = optuna.get_all_study_names(url)
    assert len(names) == 2 and all(name.startswith("lr-") for name in names)
    assert all(len(optuna.load_study(study_name=name, storage=url).trials) == 1 for name in names)


def test_export_of_a_sweep_or_search_directory_names_the_run_directories(tmp_path: Path) -> None:
    """`launcher.export SWEEP_DIR` (and sample, evaluate): a search directory is refused naming its best trial's run
    directory, a grid sweep's naming where its points are; not 'has no complete checkpoint: train it first'."""
    import time

    import optuna

    from contract.search import layout
    from contract.search.optuna_objects import create_study
    from launcher.export import pick_checkpoint
    from launcher.sweeps.sweepdir import Point, Sweep, save_sweep

    search_dir = tmp_path / "sweeps" / "lr"
    spec = layout.SearchSpec(
        study_name=layout.study_name(search_dir), storage="", params={}, overrides=[], metric="val/val/loss",
        higher_is_better=False, pruner={"name": "none", "min_resource": 5}, sampler={"name": "random", "seed": 0},
        n_trials=2, parallel=1, max_gpu_hours=None, timeout=None, max_steps=30, ranks=1, cwd=str(tmp_path),
        command="", created=time.time())
    search_dir.mkdir(parents=True)
    layout.save_spec(search_dir, spec)
    study = create_study(search_dir, spec)
    with pytest.raises(ConfigError, match="is a search directory, not a run: .*none is complete yet"):
        pick_checkpoint(search_dir, None)
    dist = optuna.distributions.FloatDistribution(1e-4, 1e-1)
    for number, value in enumerate((3.5, 2.5)):
        study.add_trial(optuna.trial.create_trial(
            params={"optim.lr": 1e-3}, distributions={"optim.lr": dist}, value=value,
            user_attrs={"run_dir": str(layout.trial_dir(search_dir, number))}))
    with pytest.raises(ConfigError, match=r"the best so far is trial 1: .*trial_0001") as err:
        pick_checkpoint(search_dir, None, best=True)
    assert "train it first" not in str(err.value)

    grid_dir = tmp_path / "sweeps" / "grid"
    save_sweep(grid_dir, Sweep(name="grid", command="", swept=["optim.lr"],
                               points=[Point(index=0, overrides=["optim.lr=1e-3"], run_dir=str(tmp_path / "p0"))]))
    with pytest.raises(ConfigError, match="is a sweep directory, not a run: pass one of its points' run directories"):
        pick_checkpoint(grid_dir, 5)


@pytest.mark.parametrize("sampler", ["grid", "cmaes", "tpe", "random"])
def test_every_sampler_asks_as_the_workers_do(tmp_path: Path, sampler: str) -> None:
    """Each ask builds a fresh sampler (contract/search/optuna_objects.py), as a worker does under the ask lock. The
    grid sampler shuffles its grid by its seed, so a seed changed per ask repeated points and missed others (6 asks
    of a 3 x 2 grid gave 3 distinct points, weight decay 0.0 never): it covers its grid once. CMA-ES runs (its
    `cmaes` package is a dependency) and stays in bounds."""
    import time

    from optuna.trial import TrialState

    from contract.search import layout
    from contract.search.optuna_objects import create_study, distributions, load_study

    if sampler == "grid":
        params = {"optim.lr": {"type": "categorical", "choices": [1e-3, 3e-3, 1e-2]},
                  "optim.weight_decay": {"type": "categorical", "choices": [0.0, 0.1]}}
    else:
        params = {"optim.lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
                  "optim.weight_decay": {"type": "float", "low": 0.0, "high": 0.2}}
    spec = layout.SearchSpec(
        study_name="s", storage="", params=params, overrides=[], metric="val/val/loss", higher_is_better=False,
        pruner={"name": "none", "min_resource": 5}, sampler={"name": sampler, "seed": 0}, n_trials=6, parallel=1,
        max_gpu_hours=None, timeout=None, max_steps=30, ranks=1, cwd=str(tmp_path), command="", created=time.time())
    create_study(tmp_path, spec)
    asked = []
    for i in range(6):
        study = load_study(tmp_path, spec, asked_before=i)
        trial = study.ask(distributions(spec))
        asked.append((trial.params["optim.lr"], trial.params["optim.weight_decay"]))
        if sampler == "grid":  # as Worker.tell: the grid sampler would stop the study outside study.optimize
            import optuna

            study.sampler = optuna.samplers.RandomSampler()
        study.tell(trial.number, float(i % 4))
    if sampler == "grid":
        assert sorted(asked) == sorted((lr, wd) for lr in (1e-3, 3e-3, 1e-2) for wd in (0.0, 0.1)), asked
    else:
        assert all(1e-5 <= lr <= 1.0 and 0.0 <= wd <= 0.2 for lr, wd in asked), asked
        assert len(set(asked)) == 6
    assert all(t.state == TrialState.COMPLETE for t in load_study(tmp_path, spec).get_trials())


def _lr_search(sweep_dir: Path, n_trials: int):  # type: ignore[no-untyped-def]
    """A random search over optim.lr, its spec saved and its study created in sweep_dir: the worker's side."""
    import time

    from contract.search import layout
    from contract.search.optuna_objects import create_study

    spec = layout.SearchSpec(
        study_name="s", storage="", params={"optim.lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True}},
        overrides=[], metric="val/val/loss", higher_is_better=False, pruner={"name": "none", "min_resource": 5},
        sampler={"name": "random", "seed": 0}, n_trials=n_trials, parallel=1, max_gpu_hours=None, timeout=None,
        max_steps=30, ranks=1, cwd=str(sweep_dir), command="", created=time.time())
    layout.save_spec(sweep_dir, spec)
    create_study(sweep_dir, spec)
    return spec


def test_a_trial_whose_ask_failed_is_failed_not_resumed_with_the_base_config(tmp_path: Path) -> None:
    """A sampler that raised while asking (CMA-ES without its package did) left its trial RUNNING with no values;
    the next command resumed it, training the base config recorded with empty parameters. The worker fails it,
    saying why, and asks a new one."""
    from optuna.trial import TrialState

    from contract.search import layout
    from contract.search.optuna_objects import load_study
    from launcher.sweeps.search_worker import Worker

    spec = _lr_search(tmp_path, 3)
    assert load_study(tmp_path, spec).ask().number == 0  # asked, no value drawn
    layout.write_json(tmp_path / layout.RESUME_FILE, [0])
    assert Worker(tmp_path, 0).take() == 1
    trials = load_study(tmp_path, spec).get_trials()
    assert trials[0].state == TrialState.FAIL and "never drawn" in trials[0].user_attrs["reason"]
    assert trials[1].state == TrialState.RUNNING and set(trials[1].params) == {"optim.lr"}


def test_continuing_with_fewer_trials_than_were_asked_is_refused(tmp_path: Path) -> None:
    """search.n_trials lowered below the trials a search already holds was taken, and status then said '6 of 3'."""
    import dataclasses

    from contract.search.optuna_objects import load_study
    from launcher.sweeps.search_settings import continued

    spec = _lr_search(tmp_path, 6)
    for _ in range(4):
        load_study(tmp_path, spec).ask()
    with pytest.raises(ConfigError, match="search.n_trials=3: .* already holds 4 trials: give search.n_trials=4"):
        continued(tmp_path, dataclasses.replace(spec, n_trials=3))
    assert continued(tmp_path, dataclasses.replace(spec, n_trials=4)).n_trials == 4


def test_a_local_worker_is_stopped_when_the_command_that_started_it_dies(tmp_path: Path) -> None:
    """Local workers run in sessions of their own; a kill -9 of the search command left them training the whole
    study unseen. Each gets SIGTERM (its trial checkpoints) when its parent dies."""
    import os
    import select
    import signal
    import subprocess
    import sys

    script = ("import subprocess, sys, time\n"
              "from launcher.sweeps.search_local import die_with_parent\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True,"
              " preexec_fn=die_with_parent())\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=60)
    try:
        ended = os.pidfd_open(child)  # readable once the process has ended: the event itself, no polling
    except ProcessLookupError:
        return  # ended and reaped already
    try:
        readable, _, _ = select.select([ended], [], [], 60)
        if not readable:
            os.kill(child, signal.SIGKILL)  # leave no sleeper behind
        assert readable, "the worker outlived the command that started it"
    finally:
        os.close(ended)


def test_the_gpu_hours_to_the_end_extrapolate_the_steady_pace_not_the_start_up(tmp_path: Path) -> None:
    """A pruned trial's time per step was its seconds over its steps, start-up and a resume's restart included: the
    status's 'GPU-hours ... had every trial run to the end' read about 4x high after an interruption. The steps left
    go at the steady pace (the median between logged rows); what was used counts as used."""
    import json

    from optuna.trial import TrialState

    from contract.search.optuna_objects import distributions, load_study
    from launcher.sweeps.search_status import collect
    from launcher.sweeps.search_worker import steady_step_seconds

    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    # 60 s of start-up before step 2, 0.5 s a step, a 300 s restart between steps 6 and 8, then 0.5 s a step again.
    times = {2: 60.0, 4: 61.0, 6: 62.0, 8: 362.0, 10: 363.0, 12: 364.0}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "time": 1e9 + t, "loss": 1.0}) + "\n"
                                                   for k, t in times.items()))
    assert steady_step_seconds(run_dir) == pytest.approx(0.5)
    assert steady_step_seconds(tmp_path / "no_trial") is None

    spec = _lr_search(tmp_path, 2)
    study = load_study(tmp_path, spec)
    trial = study.ask(distributions(spec))
    for key, value in {"seconds": 364.0, "steps": 12, "max_steps": 30, "ranks": 2, "step_s": 0.5}.items():
        trial.set_user_attr(key, value)
    trial.report(2.0, 5)
    study.tell(trial.number, state=TrialState.PRUNED)
    summary = collect(tmp_path)
    assert summary.gpu_hours == pytest.approx(364.0 * 2 / 3600)
    assert summary.gpu_hours_to_end == pytest.approx((364.0 + 18 * 0.5) * 2 / 3600)  # not 364 x 30/12 x 2


def test_a_local_search_with_no_complete_trial_exits_1_saying_so(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Every trial pruned (or failed) ended the command with 0, and `search && export --best` then failed later."""
    from optuna.trial import TrialState

    from contract.search.optuna_objects import distributions, load_study
    from launcher.sweeps.search_local import ended_without_best

    (tmp_path / "failed").mkdir()
    spec = _lr_search(tmp_path / "failed", 1)
    study = load_study(tmp_path / "failed", spec)
    study.tell(study.ask(distributions(spec)).number, state=TrialState.FAIL)
    assert ended_without_best(tmp_path / "failed") == 1
    said = capsys.readouterr().err
    assert "(1 failed)" in said and "the failures to mend" in said and "pruner" not in said  # not a pruning matter

    spec = _lr_search(tmp_path, 3)
    study = load_study(tmp_path, spec)
    for how in (TrialState.PRUNED, TrialState.PRUNED, TrialState.FAIL):
        trial = study.ask(distributions(spec))
        trial.report(3.0, 5)
        study.tell(trial.number, state=how)
    assert ended_without_best(tmp_path) == 1
    said = capsys.readouterr().err
    assert "no trial completed with a finite val/val/loss (2 pruned, 1 failed): there is no best" in said
    assert "search.min_improvement=0" in said  # pruned ones: the pruner is what to loosen
    trial = study.ask(distributions(spec))
    study.tell(trial.number, 2.5)
    assert ended_without_best(tmp_path) == 0


def test_a_pruned_trial_names_the_pruner_the_user_chose() -> None:
    """The re-trial of issue 48: under search.pruner=asha the pruned line said 'successivehalving pruner'."""
    from types import SimpleNamespace

    from contract.search.optuna_objects import StalledPruner

    class Always:  # Optuna's pruner, as the wrapper sees it
        def prune(self, study: object, trial: object) -> bool:
            return True

    Always.__name__ = "SuccessiveHalvingPruner"
    stalled = StalledPruner(Always(), 10, 0.01, "asha")
    trial = SimpleNamespace(last_step=10, intermediate_values={0: 5.0, 10: 2.0})  # 60% better: not the step-0 rule
    assert stalled.prune(SimpleNamespace(direction=None), trial) is True
    assert stalled.rule == "search.pruner=asha (Optuna's SuccessiveHalvingPruner)"
