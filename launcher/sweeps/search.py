"""`python -m launcher -m hydra/sweeper=search 'optim.lr=tag(log,interval(1e-5,1e-1))' search.n_trials=32 ...`:
a hyperparameter search. Checked whole before anything is created (every parameter's ends composed, validated and
planned), then the study is created in the sweep directory (Optuna's file journal; search.storage for an RDB) and
search.parallel workers (launcher/sweeps/search_worker.py) train its trials: one SLURM array, returning at once, or
local processes that this command waits for. The same command again continues the study: completed trials are
kept, trials left running by workers that are gone are resumed first (contract/search/layout.py)."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import EXIT_BAD_INPUT, EXIT_STOPPED, ConfigError, SweepExit
from contract.rules.eval_sets import resolved_sets
from contract.rules.metric_order import ranking
from contract.search import layout
from contract.search.optuna_objects import PRUNERS, SAMPLERS
from launcher.run.remote.hints import follow_command
from launcher.sweeps.search_space import Space, grid_values, override, parse

if TYPE_CHECKING:
    from launcher.sweeps.sweep import SweepLauncher


def run_search(launcher: SweepLauncher, config: DictConfig, arguments: list[str]) -> int:
    """Bad input: one line, exit 2, nothing created."""
    try:
        return _run(launcher, config, arguments)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SweepExit(EXIT_BAD_INPUT) from None


def _run(launcher: SweepLauncher, config: DictConfig, arguments: list[str]) -> int:
    from launcher.sweeps.sweep_run import plan_point

    space = parse(arguments)
    sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().resolve()
    first = [override(k, v[0]) for k, v in space.corners.items()]
    try:
        base = _load(launcher, space.fixed + first)
    except ConfigError as err:
        raise ConfigError(_interval_of_an_int(space, str(err))) from None
    s = base.search
    _check_settings(base, space)
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
            raise ConfigError(str(err).replace(f"sweep point {index} (", "the search's trial (", 1)) from None
    plan = planned[0].plan
    spec = _spec(base, space, sweep_dir, plan)
    first_rung = int(spec.pruner["min_resource"])
    if spec.pruner["name"] != "none" and first_rung >= spec.max_steps:
        raise ConfigError(f"search.pruner={spec.pruner['name']} first prunes at step {first_rung} (search.min_resource, "
                          f"else eval.every), and a trial trains {spec.max_steps} steps: no trial could be pruned: set "
                          f"search.min_resource (or eval.every) below {spec.max_steps}, or search.pruner=none")
    worst = _worst_case(spec, plan)
    if (sweep_dir / layout.SPEC_FILE).is_file():
        spec = _continued(sweep_dir, spec)
    # Each trial trains in its own run directory under the sweep directory, not in the one a single run would have.
    print(plan.summary().replace(str(plan.run_dir), str(sweep_dir / layout.TRIALS_DIR / "trial_NNNN")),
          file=sys.stderr)
    print(f"search {sweep_dir.name}: {spec.n_trials} trials over {', '.join(space.params)}, {spec.parallel} "
          f"worker(s), sampler {spec.sampler['name']}, pruner {spec.pruner['name']} on {spec.metric} "
          f"({'higher' if spec.higher_is_better else 'lower'} is better); {worst}", file=sys.stderr)
    if base.launcher.dry_run:
        print("dry run: nothing created or submitted", file=sys.stderr)
        return 0
    if base.cluster is None:
        refuse_live_local_workers(sweep_dir)
        _create(sweep_dir, spec, base)
        return _run_here(sweep_dir, spec)
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


def _load(launcher: SweepLauncher, overrides: list[str]) -> DictConfig:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return launcher.load_point(overrides)
    except (HydraException, OmegaConfBaseException) as err:  # a misspelt key: Hydra's words, with ours
        from launcher.checks.hydra_errors import one_line

        text = str(err) + ("\n" + str(err.__cause__) if err.__cause__ is not None else "")
        raise ConfigError(one_line(text).removeprefix("error: ")) from None


def _check_settings(cfg: DictConfig, space: Space) -> None:
    s = cfg.search
    if s.n_trials < 1:
        raise ConfigError(f"search.n_trials={s.n_trials}: a search needs at least one trial (search.n_trials=N, N >= 1)")
    if s.parallel < 1:
        raise ConfigError(f"search.parallel={s.parallel}: give at least one worker (search.parallel=N, N >= 1)")
    if s.pruner not in PRUNERS:
        raise ConfigError(f"search.pruner={s.pruner}: choose one of {', '.join(PRUNERS)}")
    if s.sampler not in SAMPLERS:
        raise ConfigError(f"search.sampler={s.sampler}: choose one of {', '.join(SAMPLERS)}")
    if s.storage:
        _check_storage(str(s.storage))
    if int(cfg.eval.every) <= 0:
        need = f"search.pruner={s.pruner} prunes at evaluations" if s.pruner != "none" else \
            "a search compares its trials by a validation metric"
        raise ConfigError(f"{need}, and this run never evaluates: set eval.every=N (N steps between evaluations, "
                          "the pruner's first rung)")
    if cfg.cluster is not None and int(cfg.cluster.nodes) != 1:
        raise ConfigError(f"cluster.nodes={cfg.cluster.nodes}: a search's trials train on one node each (each worker "
                          "is one array task): set cluster.nodes=1")
    metric = search_metric(cfg)
    parts = metric.split("/")
    sets = list(resolved_sets(cfg))
    if parts[0] != "val" or len(parts) != 3 or parts[1] not in sets or parts[2] not in ("loss", "ppl"):
        raise ConfigError(f"search.metric={metric}: the trials report what they validate at each evaluation: "
                          f"{', '.join(f'val/{name}/loss' for name in sets)} (or a set's /ppl)")


def _check_storage(url: str) -> None:
    """search.storage names an RDB whose dialect and driver SQLAlchemy has (connecting waits for _create)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(url).get_dialect()
    except Exception as err:  # ArgumentError (not a URL), NoSuchModuleError (no such dialect), ImportError (driver)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"search.storage={url} is no RDB URL SQLAlchemy can open ({first}): give one such as "
                          "sqlite:///PATH or postgresql://USER@HOST/DB, or leave search.storage unset for the "
                          "journal file in the sweep directory") from None


def search_metric(cfg: DictConfig) -> str:
    """search.metric, else checkpoint.keep_best's metric, else the first validation set's loss."""
    if cfg.search.metric:
        return str(cfg.search.metric).rpartition(":")[0] if ":" in str(cfg.search.metric) else str(cfg.search.metric)
    if cfg.checkpoint.keep_best:
        keep = str(cfg.checkpoint.keep_best)
        return keep.rpartition(":")[0] if ":" in keep else keep
    return f"val/{next(iter(resolved_sets(cfg)))}/loss"


def _spec(cfg: DictConfig, space: Space, sweep_dir: Path, plan: Any) -> layout.SearchSpec:
    s = cfg.search
    metric = search_metric(cfg)
    raw = str(s.metric or cfg.checkpoint.keep_best or metric)
    n_trials = int(s.n_trials)
    if s.sampler == "grid":
        size = Space(params=space.params).grid_size() or n_trials
        if n_trials > size:
            print(f"note: search.sampler=grid has {size} combinations: the search runs {size} trials, not "
                  f"search.n_trials={n_trials}", file=sys.stderr)
            n_trials = size
    max_steps = int(plan.max_steps or cfg.trainer.max_steps)
    every = int(cfg.eval.every)
    return layout.SearchSpec(
        study_name=layout.study_name(sweep_dir), storage=str(s.storage or ""), params=space.params, overrides=space.fixed,
        metric=metric, higher_is_better=ranking(raw, "search.metric").higher_is_better,
        pruner={"name": str(s.pruner), "min_resource": int(s.min_resource or every),
                "reduction_factor": int(s.reduction_factor), "max_resource": max_steps,
                "min_improvement": float(s.min_improvement)},
        sampler={"name": str(s.sampler), "seed": int(s.seed)}, n_trials=n_trials, parallel=int(s.parallel),
        max_gpu_hours=None if s.max_gpu_hours is None else float(s.max_gpu_hours),
        timeout=None if s.timeout is None else float(s.timeout), max_steps=max_steps, ranks=int(plan.world_size),
        cwd=os.getcwd(), command=shlex.join(["python", "-m", "launcher", *sys.argv[1:]]), created=time.time())


def _worst_case(spec: layout.SearchSpec, plan: Any) -> str:
    text = f"worst case (no trial pruned): {spec.n_trials} x {spec.max_steps} = {spec.n_trials * spec.max_steps} steps"
    if plan.gpus:
        text += (f", {spec.n_trials} x {plan.gpu_hours:,.1f} = {spec.n_trials * plan.gpu_hours:,.1f} GPU-hours "
                 "reserved (each trial at most one time limit per attempt)")
    if plan.budget is not None and plan.budget.gpu_hours is not None:
        text += f"; estimated {spec.n_trials * plan.budget.gpu_hours:,.1f} GPU-hours to the end of every trial"
    if spec.max_gpu_hours is not None:
        text += f"; stops taking trials at search.max_gpu_hours={spec.max_gpu_hours:g}"
    if spec.timeout is not None:
        text += f"; stops taking trials search.timeout={spec.timeout:g} s after it started"
    return text


SAME_STUDY = ("params", "overrides", "metric", "higher_is_better", "pruner", "sampler", "storage", "max_steps")


def _continued(sweep_dir: Path, spec: layout.SearchSpec) -> layout.SearchSpec:
    """The same command again continues the study; anything that would change what its trials mean is refused. The
    budget (n_trials, parallel, max_gpu_hours, timeout) may change."""
    old = layout.load_spec(sweep_dir)
    changed = [k for k in SAME_STUDY if getattr(old, k) != getattr(spec, k) and k not in ("pruner", "overrides")]
    if _trained(old.overrides) != _trained(spec.overrides):
        changed.append("overrides")
    if {k: v for k, v in old.pruner.items()} != spec.pruner:
        changed.append("pruner")
    if changed:
        raise ConfigError(f"{sweep_dir} holds a search with other {', '.join(changed)}: give this search its own "
                          "launcher.sweep_name (or run.root), or repeat the first command to continue that one")
    from contract.search.optuna_objects import load_study

    asked = len(load_study(sweep_dir, old).get_trials(deepcopy=False))
    if spec.n_trials < asked:
        raise ConfigError(f"search.n_trials={spec.n_trials}: {sweep_dir} already holds {asked} trials: give "
                          f"search.n_trials={asked} or more to continue it")
    for key in ("n_trials", "parallel", "max_gpu_hours", "timeout", "ranks"):
        setattr(old, key, getattr(spec, key))
    return old


def _trained(overrides: list[str]) -> list[str]:
    """The overrides that change what a trial is: not how it is launched or the search's budget."""
    return sorted(o for o in overrides if not o.lstrip("+~").startswith(("launcher.", "search.", "hydra.")))


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


def refuse_live_local_workers(sweep_dir: Path) -> None:
    """Workers of an earlier command on this host still at work (another terminal): a second set would resume the
    trials they train."""
    import socket

    for path in sorted((sweep_dir / layout.WORKERS_DIR).glob("worker_*.json")):
        state = layout.read_json(path, {})
        pid = state.get("pid")
        if state.get("job") or state.get("host") != socket.gethostname() or not isinstance(pid, int):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        raise ConfigError(f"search {sweep_dir.name} is still running here (worker pid {pid}): wait for it, or stop it "
                          f"(kill -TERM {pid} checkpoints its trial) and run this command again")


def die_with_parent() -> Callable[[], None] | None:
    """For a local worker's Popen(preexec_fn=...): SIGTERM when the command that started it dies however it dies (a
    kill -9, a terminal's SIGKILL), which checkpoints the worker's trial and stops it. In sessions of their own (a
    Ctrl-C reaches them through the command, once), the workers went on training the whole study unseen. Linux
    only (None elsewhere). prctl is looked up here, before the fork: the child only calls it (no import there)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl, term = ctypes.CDLL(None, use_errno=True).prctl, int(signal.SIGTERM)
    return lambda: prctl(1, term)  # PR_SET_PDEATHSIG


def _run_here(sweep_dir: Path, spec: layout.SearchSpec) -> int:
    """search.parallel worker processes on this machine; Ctrl-C (or a stop signal) asks them to checkpoint their trials
    and stop, and the same command resumes."""
    import signal

    from launcher.sweeps.search_status import print_status

    cmd = [sys.executable, "-m", "launcher.sweeps.search_worker", str(sweep_dir)]
    procs = [subprocess.Popen([*cmd, str(i)], start_new_session=True, preexec_fn=die_with_parent())
             for i in range(spec.parallel)]
    print(f"search {sweep_dir.name}: {spec.parallel} local worker(s) started", file=sys.stderr, flush=True)

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        codes = [p.wait() for p in procs]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print_status(sweep_dir)
    print(f"sweep directory: {sweep_dir}", file=sys.stderr)
    if any(c == EXIT_STOPPED for c in codes):
        print("search stopped: a trial was checkpointed; run the same command to resume it and continue",
              file=sys.stderr)
        return EXIT_STOPPED
    return next((c for c in codes if c), 0) or _ended_without_best(sweep_dir)


def _ended_without_best(sweep_dir: Path) -> int:
    """1 when the search ended with no trial complete (every one pruned or failed: no best to export or compare), with
    a line saying so; 0 otherwise. A script chaining `search && export` stopped at a best that was not there."""
    from collections import Counter

    from launcher.sweeps.search_status import collect

    summary = collect(sweep_dir)
    if summary.best is not None:
        return 0
    counts = Counter(r.state for r in summary.trials)
    if not summary.trials:
        said = "no trial was trained (the budget was spent before the first)"
    else:
        ended = ", ".join(f"{n} {state}" for state, n in counts.items())
        said = f"no trial completed with a finite {summary.metric} ({ended})"
    fix = "the table above says why each ended"
    if counts.get("pruned"):
        fix += ": widen the space, or loosen search.pruner (search.min_improvement=0 turns off the step-0 rule)"
    elif counts.get("failed"):
        fix += ": its reasons are the failures to mend"
    print(f"search {sweep_dir.name}: {said}: there is no best; {fix}", file=sys.stderr)
    return 1
