"""A search spec's Optuna objects: the study's storage, its pruner and sampler, the searched distributions.

Both sides build them from the same spec (launcher/sweeps/ creates the study and asks; train/search/ reports and
asks the pruner), so the pruner a trial consults is the one the search was started with. Optuna is imported
lazily: the login side's status tool reads the spec without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from contract.search.layout import JOURNAL_FILE, SearchSpec

PRUNERS = ("median", "asha", "hyperband", "none")
SAMPLERS = ("tpe", "random", "grid", "cmaes")


def storage(sweep_dir: Path, spec: SearchSpec) -> Any:
    """The RDB URL as Optuna takes it, or the journal file in the sweep directory (a file lock of its own, no
    server: what a shared filesystem offers)."""
    if spec.storage:
        return spec.storage
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(Path(sweep_dir).resolve() / JOURNAL_FILE)))


def distribution(param: dict[str, Any]) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = param["type"]
    if kind == "categorical":
        return CategoricalDistribution(param["choices"])
    if kind == "int":
        return IntDistribution(int(param["low"]), int(param["high"]), log=bool(param.get("log")),
                               step=int(param.get("step") or 1))
    return FloatDistribution(float(param["low"]), float(param["high"]), log=bool(param.get("log")),
                             step=param.get("step"))


def distributions(spec: SearchSpec) -> dict[str, Any]:
    return {key: distribution(p) for key, p in spec.params.items()}


def sampler(spec: SearchSpec, asked_before: int) -> Any:
    """A fresh sampler per ask, seeded with the seed plus the trials asked before it: workers that start together
    get different values, and one worker gets the same trials every time. The grid sampler alone keeps the seed:
    it shuffles its grid by it and records each trial's place in that order (grid_id), so another seed per ask
    would read the recorded places in another order, repeating points and missing others; it already takes an
    unvisited point, running ones aside, whoever asks."""
    import optuna

    name, seed = spec.sampler["name"], int(spec.sampler.get("seed", 0))
    if name == "grid":
        space = {key: p["choices"] for key, p in spec.params.items()}
        return optuna.samplers.GridSampler(space, seed=seed)
    seed += asked_before
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(seed=seed)


def pruner(spec: SearchSpec) -> Any:
    import optuna

    p = spec.pruner
    name, first = p["name"], int(p["min_resource"])
    inner: Any
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        inner = optuna.pruners.MedianPruner(n_startup_trials=int(p.get("n_startup_trials", 2)), n_warmup_steps=first)
    elif name == "asha":
        inner = optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=int(p["reduction_factor"]))
    else:
        inner = optuna.pruners.HyperbandPruner(min_resource=first, max_resource=int(p["max_resource"]),
                                               reduction_factor=int(p["reduction_factor"]))
    return StalledPruner(inner, first, float(p.get("min_improvement", 0.0)), name)


def _stalled_class() -> type:
    import optuna

    class Stalled(optuna.pruners.BasePruner):  # type: ignore[misc]
        """The chosen pruner, and before it one rule no pruner has: from the first rung on, a trial whose metric has
        not improved on its own step-0 value (the untrained model's, eval.at_start) by `min_improvement` of it is
        pruned. That is a frozen learning rate or a diverging one. Optuna's successive halving promotes the first
        trial to reach a rung unconditionally (it cannot suspend it, as ASHA would): without this rule a hopeless
        first trial would run to the end."""

        def __init__(self, inner: Any, first: int, min_improvement: float, name: str) -> None:
            self.inner, self.first, self.min_improvement, self.name = inner, first, min_improvement, name
            self.rule = ""  # which rule pruned, after prune() said True: the pruned event and log line name it

        def prune(self, study: Any, trial: Any) -> bool:
            step = trial.last_step
            if step is None:
                return False
            value = trial.intermediate_values[step]
            if step >= self.first and math.isnan(value):
                self.rule = "its metric is NaN"
                return True
            start = trial.intermediate_values.get(0)
            if self.min_improvement > 0 and step >= self.first and start is not None and math.isfinite(start):
                maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
                gain = (value - start) if maximize else (start - value)
                if not gain > self.min_improvement * abs(start):
                    self.rule = (f"not {self.min_improvement:.0%} better than its step-0 value {start:.4g} "
                                 "(search.min_improvement)")
                    return True
            # the user's name for it (asha is Optuna's SuccessiveHalvingPruner)
            self.rule = f"search.pruner={self.name} (Optuna's {type(self.inner).__name__})"
            return bool(self.inner.prune(study, trial))

    return Stalled


def StalledPruner(inner: Any, first: int, min_improvement: float, name: str) -> Any:  # noqa: N802 - a class, built lazily
    return _stalled_class()(inner, first, min_improvement, name)


def direction(spec: SearchSpec) -> Literal["minimize", "maximize"]:
    return "maximize" if spec.higher_is_better else "minimize"


def load_study(sweep_dir: Path, spec: SearchSpec, asked_before: int = 0) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=spec.study_name, storage=storage(sweep_dir, spec),
                             sampler=sampler(spec, asked_before), pruner=pruner(spec))


def create_study(sweep_dir: Path, spec: SearchSpec) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=spec.study_name, storage=storage(sweep_dir, spec),
                               direction=direction(spec), load_if_exists=True, sampler=sampler(spec, 0),
                               pruner=pruner(spec))
