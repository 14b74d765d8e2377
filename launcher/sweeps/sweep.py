"""The `slurmtrain` Hydra Launcher plugin (hydra/launcher=slurmtrain): `-m` sweeps as SLURM job arrays.

slurmtrain's own config selects it for every `python -m launcher -m ...`. Its points are training runs
(`launcher/sweeps/sweep_run.py`): with `+cluster` one job array per resource shape, returning at once; without, one point
after another on this machine. Any other Hydra app that selects it gets the generic behaviour of a submitit
launcher: every job of a batch is one task of a SLURM array running the app's task function, and the results
come back to Hydra (`hydra.launcher.wait=false` returns the array task ids instead, without waiting).
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)
SWEEP_NAME_RESOLVER = "slurmtrain_sweep_name"
# A search's budget: the same search command with more trials or workers continues the same search.
SEARCH_BUDGET = ("search.n_trials=", "search.parallel=", "search.max_gpu_hours=", "search.timeout=")


@dataclass
class SlurmtrainLauncherConf:
    _target_: str = "hydra_plugins.slurmtrain_launcher.SlurmtrainLauncher"
    # slurmtrain's config.yaml sets this: every point is a training run planned and submitted by slurmtrain,
    # taking its SLURM resources from its own `cluster` config. The keys below are for other Hydra apps.
    training: bool = False
    # Generic apps: follow the array and return the task function's results (Hydra's usual contract).
    wait: bool = True
    partition: str | None = None
    time_min: int = 60
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    mem_gb: float | None = None
    array_parallelism: int = 256
    setup: list[str] = field(default_factory=list)
    additional_parameters: dict[str, Any] = field(default_factory=dict)


def sweep_name(explicit: str | None, overrides: Any) -> str:
    """The sweep's name: given, or derived from its overrides (order-free, launcher.* left out), so that the same
    sweep command names the same sweep and resumes it."""
    if explicit:
        return str(explicit)
    items = list(overrides) if isinstance(overrides, (list, ListConfig)) else []
    kept = sorted(str(o) for o in items if not str(o).lstrip("+~").startswith(("launcher.", "hydra.", *SEARCH_BUDGET)))
    return "sweep-" + hashlib.sha1(json.dumps(kept).encode()).hexdigest()[:8]


@dataclass
class SlurmtrainSweeperConf:
    _target_: str = "hydra_plugins.slurmtrain_launcher.SlurmtrainSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


@dataclass
class SearchSweeperConf:
    """hydra/sweeper=search: a hyperparameter search (launcher/sweeps/search.py); its settings are the search.* keys."""

    _target_: str = "hydra_plugins.slurmtrain_launcher.SlurmtrainSearchSweeper"


def register_launcher() -> None:
    store = ConfigStore.instance()
    store.store(group="hydra/launcher", name="slurmtrain", node=SlurmtrainLauncherConf, provider="slurmtrain")
    store.store(group="hydra/sweeper", name="slurmtrain", node=SlurmtrainSweeperConf, provider="slurmtrain")
    store.store(group="hydra/sweeper", name="search", node=SearchSweeperConf, provider="slurmtrain")
    if not OmegaConf.has_resolver(SWEEP_NAME_RESOLVER):
        OmegaConf.register_new_resolver(SWEEP_NAME_RESOLVER, sweep_name)


class SweepSweeper(Sweeper):
    """Hydra's basic sweeper, without composing every point a second time before launching when the launcher is
    slurmtrain's training launcher: that one composes, validates and plans every point before anything runs,
    and names the point in its error (Hydra's check would double a 64-point sweep's latency).

    It wraps rather than subclasses BasicSweeper: Hydra's plugin scan re-executes that module, and a subclass of the
    class seen before the scan fails BasicSweeper's own `super(BasicSweeper, self)`."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        from hydra._internal.core_plugins import basic_sweeper

        self.inner = basic_sweeper.BasicSweeper(max_batch_size=max_batch_size, params=params)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.inner.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        if OmegaConf.select(config, "hydra.launcher.training", default=False):
            # Which of the sweep directory's parents exist before the sweeper makes it: bad input removes only
            # what this command created.
            # Unnormalised: a bad sweep name ("..") still lists the directories mkdir would make on the way.
            sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser()
            sweep_dir = sweep_dir if sweep_dir.is_absolute() else Path.cwd() / sweep_dir
            if isinstance(self.inner.launcher, SweepLauncher):
                self.inner.launcher.created = [p for p in (sweep_dir, *sweep_dir.parents)
                                               if p.name not in ("", ".", "..") and not p.exists()]
            self.inner.validate_batch_is_legal = lambda batch: None  # type: ignore[method-assign]
            # A training sweep is checked as a whole and submitted as arrays: batches would split both.
            if self.inner.max_batch_size:
                print(f"note: hydra.sweeper.max_batch_size={self.inner.max_batch_size} is ignored: a training sweep is "
                      "checked whole and submitted as one array per resource shape (cluster.array_parallelism "
                      "limits how many tasks run at once)", file=sys.stderr)
                self.inner.max_batch_size = None

    def sweep(self, arguments: list[str]) -> Any:
        return self.inner.sweep(arguments)


class SearchSweeper(Sweeper):
    """hydra/sweeper=search: the command's sweep overrides are a search space, not a grid (launcher/sweeps/search.py).
    Points are composed by slurmtrain's training launcher (its load_point), which Hydra instantiates here."""

    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.launcher: SweepLauncher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context, task_function=task_function,
                                                         config=config)
        assert isinstance(launcher, SweepLauncher)
        self.launcher = launcher

    def sweep(self, arguments: list[str]) -> Any:
        from launcher.checks import hydra_errors
        from launcher.sweeps.search import run_search

        hydra_errors.release()
        assert self.launcher is not None and self.config is not None
        setup_globals()
        code = run_search(self.launcher, self.config, list(arguments))
        if code:
            from contract.errors import SweepExit

            raise SweepExit(code)
        return []


def _is_value_override(override: Any) -> bool:
    """`trainer.seed=2` sets a value; `strategy=fsdp`, `+cluster=x`, `group@pkg=x`, `hydra...` change what is composed
    (config group names never hold a dot)."""
    key = str(override.key_or_group)
    return "." in key and "@" not in key and not key.startswith("hydra") and override.package is None


class SweepLauncher(Launcher):
    """Hydra instantiates its subclass in hydra_plugins.slurmtrain_launcher (plugins must live there)."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        # Per structural override list, the composition pickled: a point unpickles its own copy (C speed, a quarter
        # of copy.deepcopy's time on a DictConfig; Hydra pickles configs to ship them to jobs, too).
        self._composed: dict[tuple[str, ...], bytes] = {}
        self._parsed: dict[str, Any] = {}  # override text -> Hydra's parse of it (a pure function of the text)
        self._parser: Any = None
        # Directories the sweep command is about to create (set by SweepSweeper), newest first.
        self.created: list[Path] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def load_point(self, overrides: Sequence[str]) -> DictConfig:
        """A point's config, without the hydra node. Composing with Hydra costs ~0.2 s a point, mostly the defaults list: points that share
        their config-group choices share one composition, and their value overrides (`optim.lr=...`) are applied
        to a copy the way Hydra applies them after composing. Each override's text is parsed once per sweep (the
        points of a sweep repeat all but the swept ones)."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        assert self.hydra_context is not None and self.config is not None
        parsed = [self._parse(o) for o in overrides]
        values = [o for o in parsed if _is_value_override(o)]
        structural = tuple(str(o.input_line) for o in parsed if not _is_value_override(o))
        if structural not in self._composed:
            composed = self.hydra_context.config_loader.load_sweep_config(self.config, list(structural))
            with open_dict(composed):
                del composed["hydra"]  # the run's config has none; and copying it for every point is costly
            self._composed[structural] = pickle.dumps(composed, protocol=pickle.HIGHEST_PROTOCOL)
        cfg: DictConfig = pickle.loads(self._composed[structural])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg

    def _parse(self, override: str) -> Any:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        text = str(override)
        if text not in self._parsed:
            self._parser = self._parser or OverridesParser.create()
            self._parsed[text] = self._parser.parse_overrides([text])[0]
        return self._parsed[text]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launcher.checks import hydra_errors

        hydra_errors.release()  # Hydra parsed the sweep: from here on, errors are ours (one line each)
        setup_globals()
        if self.params.get("training"):
            from launcher.sweeps.sweep_run import launch_training

            return launch_training(self, job_overrides, initial_job_idx)
        return self._launch_generic(job_overrides, initial_job_idx)

    # ---- any other Hydra app: the task function as array tasks
    def _launch_generic(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        import submitit

        assert self.config is not None
        p = self.params
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=sweep_dir / ".submitit" / "%j")
        params = {"job_name": self.config.hydra.job.name, "nodes": p["nodes"], "ntasks_per_node": p["tasks_per_node"],
                  "cpus_per_task": p["cpus_per_task"], "time": p["time_min"], "partition": p["partition"],
                  "array_parallelism": p["array_parallelism"], "setup": list(p["setup"]),
                  "additional_parameters": dict(p["additional_parameters"])}
        if p["mem_gb"]:
            params["mem"] = f"{int(p['mem_gb'] * 1024)}MB"
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        nums = [initial_job_idx + i for i in range(len(job_overrides))]
        for num, overrides in zip(nums, job_overrides, strict=True):
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        jobs = executor.map_array(_GenericTask(self), [list(o) for o in job_overrides], nums,
                                  [state] * len(nums))
        if p["wait"]:
            return [job.results()[0] for job in jobs]
        return [JobReturn(overrides=list(o), status=JobStatus.COMPLETED, _return_value=job.job_id)
                for o, job in zip(job_overrides, jobs, strict=True)]


class _GenericTask:
    """What an array task runs for a generic Hydra app: the app's task function under its sweep config."""

    def __init__(self, launcher: SweepLauncher) -> None:
        self.hydra_context = launcher.hydra_context
        self.task_function = launcher.task_function
        self.config = launcher.config

    def __call__(self, overrides: list[str], job_num: int, singleton_state: dict[Any, Any]) -> JobReturn:
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.id = submitit.JobEnvironment().job_id
            config.hydra.job.num = job_num
        return run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Preempted or timed out: submitit requeues the task with the same arguments (the app starts over)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
