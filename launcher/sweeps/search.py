"""`python -m launcher -m hydra/sweeper=search 'optim.lr=tag(log,interval(1e-5,1e-1))' search.n_trials=32 ...`:
a hyperparameter search. Checked whole before anything is created (every parameter's ends composed, validated and
planned), then the study is created in the sweep directory (Optuna's file journal; search.storage for an RDB) and
search.parallel workers (launcher/sweeps/search_worker.py) train its trials: one SLURM array, returning at once, or
local processes that this command waits for. The same command again continues the study: completed trials are
kept, trials left running by workers that are gone are resumed first (contract/search/layout.py)."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import EXIT_BAD_INPUT, ConfigError, SweepExit
from contract.search import layout
from launcher.run.remote.hints import follow_command
from launcher.sweeps.points import PointLoader, plan_point
from launcher.sweeps.search_local import refuse_live_local_workers, run_local_workers
from launcher.sweeps.search_settings import check_settings, continued, make_spec, worst_case
from launcher.sweeps.search_space import Space, describe_space, grid_values, override, parse


def run_search(launcher: PointLoader, config: DictConfig, arguments: list[str]) -> int:
    """Bad input: one line, exit 2, nothing created."""
    try:
        return _run(launcher, config, arguments)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SweepExit(EXIT_BAD_INPUT) from None


def _run(launcher: PointLoader, config: DictConfig, arguments: list[str]) -> int:
    space = parse(arguments)
    sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().resolve()
    first = [override(k, v[0]) for k, v in space.corners.items()]
    try:
        base = _load(launcher, space.fixed + first)
    except ConfigError as err:
        raise ConfigError(_interval_of_an_int(space, str(err))) from None
    s = base.search
    check_settings(base, space)
    if s.sampler == "grid":
        space.params = {k: {"type": "categorical", "choices": v} for k, v in grid_values(space).items()}
    # Every parameter's ends (or choices) with the others at their first: each must make a valid, plannable run.
    corners = [first] + [[override(k, v) if k == key else first[i] for i, k in enumerate(space.corners)]
                         for key, values in space.corners.items() for v in values[1:]]
    planned = []
    for index, values in enumerate(corners):
        try:
            planned.append(plan_point(launcher, index, space.fixed + values, list(space.params), sweep_dir.name))
        except ConfigError as err:
            said = str(err).partition("): ")[2]
            if said.startswith("search."):  # the search's own setting (search.timeout=-5), not a trial's
                raise ConfigError(said) from None
            raise ConfigError(str(err).replace(f"sweep point {index} (", "the search's trial (", 1)) from None
    plan = planned[0].plan
    with open_dict(base):  # container=...: which code the trials run and the automatic mounts, as the plan settled
        base.container = planned[0].cfg.container  # them (launcher/checks/containers.py), for the workers and trials
    spec = make_spec(base, space, sweep_dir, plan)
    first_rung = int(spec.pruner["min_resource"])
    if spec.pruner["name"] != "none" and first_rung >= spec.max_steps:
        raise ConfigError(f"search.pruner={spec.pruner['name']} first prunes at step {first_rung} (search.min_resource, "
                          f"else eval.every), and a trial trains {spec.max_steps} steps: no trial could be pruned: set "
                          f"search.min_resource (or eval.every) below {spec.max_steps}, or search.pruner=none")
    worst = worst_case(spec, plan)
    if (sweep_dir / layout.SPEC_FILE).is_file():
        spec = continued(sweep_dir, spec)
    # Each trial trains in its own run directory under the sweep directory, not in the one a single run would have.
    # The plan is of one trial, the space's first corner: its searched values (a learning rate, "no weight decay")
    # are that corner's, which no trial need draw.
    print(f"plan of one trial, at the space's first corner ({' '.join(first)}; each trial draws its own values of "
          f"these):", file=sys.stderr)
    print(plan.summary().replace(str(plan.run_dir), str(sweep_dir / layout.TRIALS_DIR / "trial_NNNN")),
          file=sys.stderr)
    print(f"search {sweep_dir.name}: {spec.n_trials} trials over {', '.join(space.params)}, {spec.parallel} "
          f"worker(s), sampler {spec.sampler['name']}, pruner {spec.pruner['name']} on {spec.metric} "
          f"({'higher' if spec.higher_is_better else 'lower'} is better); {worst}", file=sys.stderr)
    print(f"space: {describe_space(spec.params)}", file=sys.stderr)
    if base.launcher.dry_run:
        print("dry run: nothing created or submitted", file=sys.stderr)
        return 0
    if base.cluster is None:
        refuse_live_local_workers(sweep_dir)
        _create(sweep_dir, spec, base)
        return run_local_workers(sweep_dir, spec)
    from launcher.sweeps import search_submit

    live = search_submit.live_tasks(spec)
    if live:
        print(f"search {sweep_dir.name}: its workers are still queued or running ({', '.join(live)}): left alone; "
              f"follow them with {follow_command('launcher.status', sweep_dir)}")
        return 0
    search_submit.preflight(base, sweep_dir)
    _create(sweep_dir, spec, base)
    return search_submit.submit_workers(sweep_dir, spec, base)


def _interval_of_an_int(space: Space, message: str) -> str:
    """Hydra's interval() is always floats: on an integer key, name range() instead of the first trial's 0.0."""
    for key, p in space.params.items():
        if p["type"] == "float" and message.startswith(f"{key}=") and ("converted to Integer" in message
                                                                      or "takes an integer" in message):
            low, high = math.ceil(p["low"]), math.floor(p["high"])
            return (f"{key} is an integer and interval() samples floats: search it with range({low},{high + 1}) "
                    f"(the integers {low} to {high}) or choice(...)")
    return message


def _load(launcher: PointLoader, overrides: list[str]) -> DictConfig:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return launcher.load_point(overrides)
    except (HydraException, OmegaConfBaseException) as err:  # a misspelt key: Hydra's words, with ours
        from launcher.checks.hydra_errors import one_line

        text = str(err) + ("\n" + str(err.__cause__) if err.__cause__ is not None else "")
        raise ConfigError(one_line(text).removeprefix("error: ")) from None


def _create(sweep_dir: Path, spec: layout.SearchSpec, base: DictConfig) -> None:
    from contract.search.optuna_objects import create_study

    created = next((d for d in reversed([sweep_dir, *sweep_dir.parents]) if not d.exists()), None)  # the top one
    sweep_dir.mkdir(parents=True, exist_ok=True)
    try:
        create_study(sweep_dir, spec)
    except Exception as err:  # an RDB URL SQLAlchemy can't open: its dialect, driver, server or file
        if not spec.storage:
            raise
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"search.storage={spec.storage} can't be opened ({type(err).__name__}: {first}): give an "
                          "RDB URL SQLAlchemy opens (sqlite:///PATH, postgresql://USER@HOST/DB), or leave "
                          "search.storage unset for the journal file in the sweep directory") from None
    layout.save_spec(sweep_dir, spec)
    with open_dict(base):
        base.logger.group = base.logger.group or sweep_dir.name
    OmegaConf.save(base, sweep_dir / layout.BASE_CONFIG)
    orphans = orphaned_trials(sweep_dir, spec)
    layout.write_json(sweep_dir / layout.RESUME_FILE, orphans)
    if orphans:
        print(f"search {sweep_dir.name}: trial(s) {', '.join(map(str, orphans))} were left running by workers that "
              "are gone: they resume first", file=sys.stderr)


def orphaned_trials(sweep_dir: Path, spec: layout.SearchSpec) -> list[int]:
    """RUNNING trials: with no worker alive (this command starts them all), each was interrupted."""
    from optuna.trial import TrialState

    from contract.search.optuna_objects import load_study

    study = load_study(sweep_dir, spec)
    for path in (sweep_dir / layout.WORKERS_DIR).glob("worker_*.json"):
        path.unlink()
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]


