"""A search's sweep directory and a trial's file. Pure stdlib.

    RUN_ROOT/sweeps/<name>/
        search.json          SearchSpec below: what was searched and how (written once, when the study is created)
        study.journal        Optuna's file journal (JournalFileBackend): the study itself, unless search.storage
        base.yaml            the composed config every trial starts from (the searched keys are set per trial)
        workers/worker_I.json   worker I's state: the trial it trains now (re-attached after a requeue), its pid
        resume.json          trials left RUNNING by workers that are gone (an scancel): the next workers take them first
        ask.lock             held while a worker counts the trials and asks for the next (never more than n_trials)
        trials/trial_NNNN/   trial NNNN's run directory: a normal run (config.yaml, metrics.jsonl, checkpoints...)
        slurm/               the workers' array: submitit's folder and logs

    RUN_DIR/trial.json      in a trial's run directory: the study and trial the run reports its metric to,
                            {"sweep_dir", "number", "trial_id", "every" (eval.every), "max_steps"}

A trial's user attributes in the study: run_dir, steps (steps trained), max_steps, seconds (its training wall time,
all attempts), ranks, reason (a failed trial's one line).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract.atomic import write_json_atomic

SPEC_FILE = "search.json"
JOURNAL_FILE = "study.journal"
BASE_CONFIG = "base.yaml"
WORKERS_DIR = "workers"
RESUME_FILE = "resume.json"
ASK_LOCK = "ask.lock"
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"


@dataclass
class SearchSpec:
    study_name: str
    storage: str  # an RDB URL, or "" for the journal file in the sweep directory
    params: dict[str, dict[str, Any]]  # key -> distribution ({"type": float|int|categorical, ...})
    overrides: list[str]  # the command's other overrides, as typed (every trial has them)
    metric: str
    higher_is_better: bool
    pruner: dict[str, Any]  # {"name": ..., "min_resource": ..., "reduction_factor": ..., "max_resource": ...}
    sampler: dict[str, Any]  # {"name": ..., "seed": ...}
    n_trials: int
    parallel: int
    max_gpu_hours: float | None
    timeout: float | None
    max_steps: int
    ranks: int  # ranks per trial (GPUs, or CPU tasks)
    cwd: str  # the launching directory: relative paths of the config resolve against it
    command: str
    created: float  # epoch seconds: search.timeout counts from here
    arrays: list[str] = field(default_factory=list)  # the SLURM arrays of workers, oldest first


def study_name(sweep_dir: Path) -> str:
    """The sweep directory's name and a hash of its path: two searches sharing one RDB (search.storage) never mix."""
    path = str(Path(sweep_dir).resolve())
    return f"{Path(path).name}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def trial_dir(sweep_dir: Path, number: int) -> Path:
    return Path(sweep_dir) / TRIALS_DIR / f"trial_{number:04d}"


def is_search_dir(path: Path) -> bool:
    return (Path(path) / SPEC_FILE).is_file()


def load_spec(sweep_dir: Path) -> SearchSpec:
    return SearchSpec(**json.loads((Path(sweep_dir) / SPEC_FILE).read_text()))


def save_spec(sweep_dir: Path, spec: SearchSpec) -> None:
    write_json_atomic(Path(sweep_dir) / SPEC_FILE, asdict(spec))


def storage_url(sweep_dir: Path, spec: SearchSpec) -> str:
    """What the study's storage is called in messages and trial.json: the RDB URL, or the journal file's path."""
    return spec.storage or str(Path(sweep_dir).resolve() / JOURNAL_FILE)


def worker_file(sweep_dir: Path, index: int) -> Path:
    return Path(sweep_dir) / WORKERS_DIR / f"worker_{index}.json"


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, payload: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path), payload)
