"""A search's settings (search.*) checked before anything is created, and its spec (contract/search/layout.py)
built from them: the metric, the pruner's rungs, the budget, the plan's worst case. The same command again continues
the study: what would change what its trials mean is refused (continued)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.eval_sets import resolved_sets
from contract.rules.metric_order import ranking
from contract.search import layout
from contract.search.optuna_objects import PRUNERS, SAMPLERS
from launcher.sweeps.search_space import Space


def check_settings(cfg: DictConfig, space: Space) -> None:
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
        check_storage(str(s.storage))
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


def check_storage(url: str) -> None:
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


def make_spec(cfg: DictConfig, space: Space, sweep_dir: Path, plan: Any) -> layout.SearchSpec:
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


def worst_case(spec: layout.SearchSpec, plan: Any) -> str:
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


def continued(sweep_dir: Path, spec: layout.SearchSpec) -> layout.SearchSpec:
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
