"""The runs a directory stands for (a run, a sweep, a run root), each with its config and SLURM job ids.

`launcher.status` makes its rows from them (launcher/observe/run_rows.py) and `launcher.report` its plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.checks import resume_checks
from launcher.sweeps.sweepdir import Sweep, is_sweep_dir, load_sweep


@dataclass
class RunRef:
    """A run to show: its directory, the label to show it under and every SLURM job id it ran as."""

    name: str
    run_dir: Path
    jobs: list[str] = field(default_factory=list)


@dataclass
class Target:
    runs: list[RunRef]
    sweep: Sweep | None = None


DAMAGED = "damaged config"


def load_config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The run's config.yaml, and None; or {} and what is wrong with it when the launcher could not resume from it
    (`PATH is damaged (why): restore it ... (cp ...)`). No file at all is {} and None: a sweep point not started."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}, None
    saved = resume_checks.parse_saved_config(path)
    if isinstance(saved, str):
        return {}, resume_checks.damaged_config(path, Path(run_dir), saved)
    data = OmegaConf.to_container(saved)
    return ({str(k): v for k, v in data.items()} if isinstance(data, dict) else {}), None


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml; {} when there is none yet or it is damaged (load_config says how)."""
    return load_config(run_dir)[0]


def read_jobs(run_dir: Path) -> list[str]:
    path = Path(run_dir) / "jobs.txt"
    return path.read_text().split() if path.is_file() else []


def _job_order(job_id: str) -> tuple[int, int]:
    # SLURM hands out ids in submission order; an array task sorts with its array.
    array, _, task = job_id.partition("_")
    return (int(array) if array.isdigit() else -1, int(task) if task.isdigit() else -1)


def merge_jobs(*sources: list[str]) -> list[str]:
    """Job ids from jobs.txt and sweep.json together, each once, oldest first."""
    return sorted({j for source in sources for j in source}, key=_job_order)


def point_run_dir(sweep_dir: Path, run_dir: str) -> Path:
    path = Path(run_dir)
    # Points train in RUN_ROOT/<run name>; the sweep lives in RUN_ROOT/sweeps/<name>.
    return path if path.is_absolute() else sweep_dir.parent.parent / path


def sweep_runs(sweep_dir: Path, sweep: Sweep) -> list[RunRef]:
    runs = []
    for point in sweep.points:
        run_dir = point_run_dir(sweep_dir, point.run_dir)
        runs.append(RunRef(sweep.point_label(point), run_dir, merge_jobs(point.jobs, read_jobs(run_dir))))
    return runs


def single_run(run_dir: Path, extra_jobs: list[str] | None = None) -> RunRef:
    config = read_config(run_dir)
    name = (config.get("run") or {}).get("name") or run_dir.name
    groups = int((config.get("parallel") or {}).get("replica_groups") or 1)
    return RunRef(str(name), run_dir, merge_jobs(with_group_tasks(read_jobs(run_dir), groups), extra_jobs or []))


def with_group_tasks(jobs: list[str], groups: int) -> list[str]:
    """parallel.replica_groups on SLURM records each launch's job array (and its lighthouse's job) by its plain id,
    and sacct and squeue know an array's groups by their task ids: JOB_0 .. JOB_{N-1} join each plain id (none
    matches a lighthouse's plain job, which keeps its own)."""
    if groups <= 1:
        return jobs
    return [*jobs, *(f"{j}_{k}" for j in jobs if j.isdigit() for k in range(groups))]


def newest_tasks(jobs: list[str]) -> list[str]:
    """The task ids of the newest job array among `jobs` (its replica groups), or [] when the newest is no array."""
    if not jobs or "_" not in jobs[-1]:
        return []
    newest = jobs[-1].partition("_")[0]
    return [j for j in jobs if j.partition("_")[0] == newest and "_" in j]


def _load_sweep(sweep_dir: Path) -> Sweep:
    try:
        return load_sweep(sweep_dir)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"cannot read {sweep_dir / 'sweep.json'}: {err}; fix or remove that file") from err


def find_runs(path: Path) -> Target:
    """The runs DIR stands for; ConfigError (one line naming the fix) when it stands for none."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory: pass a run directory, a sweep directory or a run.root")
    if is_sweep_dir(path):
        sweep = _load_sweep(path)
        return Target(sweep_runs(path, sweep), sweep)
    if (path / "config.yaml").is_file():
        damage = load_config(path)[1]
        if damage is not None:  # one run asked for: nothing else to show
            raise ConfigError(damage)
        return Target([single_run(path)])
    # A run root: the sweeps under it are not rows, but they know the array task ids of their points.
    sweep_jobs: dict[Path, list[str]] = {}
    for sweep_dir in sorted((path / "sweeps").glob("*")):
        if is_sweep_dir(sweep_dir):
            for point in _load_sweep(sweep_dir).points:
                sweep_jobs[point_run_dir(sweep_dir, point.run_dir).resolve()] = point.jobs
    children = sorted(c for c in path.iterdir() if (c / "config.yaml").is_file())
    if not children:
        raise ConfigError(f"{path} is not a run directory (no config.yaml), a sweep directory (no sweep.json) or a "
                          "directory of runs (or a prepared dataset: no manifest.json or .parts/plan.json): pass one of "
                          "those, e.g. your run.root (outputs/)")
    return Target([single_run(c, sweep_jobs.get(c.resolve())) for c in children])
