"""lm-evaluation-harness tasks (eval.harness.*) checked at launch, and their results named. Torch-free: it reads the
tasks' YAMLs with lm_eval's own index (lm_eval.tasks._index.TaskIndex, which imports no torch), never their data.

Offline by construction: evaluation runs where nothing can be downloaded (compute nodes), with the datasets library's
offline switches on (train/evaluation/harness.py). So every task must read local files: a task YAML whose dataset_path
is a file builder (json, csv, parquet, arrow, text) over absolute data_files that exist, or a local directory of
data files (a DatasetDict saved with save_to_disk is one). A task lm_eval does not know, an include path that is not
a directory, or a task whose data is not on disk is refused here in one line, before anything is created or queued.

A task's scores go wherever validation losses go, as `harness/TASK/METRIC` and `harness/TASK/METRIC_stderr`
(lm_eval's own `METRIC,FILTER` key with the default filter `none` left out): result_values.
"""

from __future__ import annotations

import difflib
import glob
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from contract.errors import ConfigError

PREFIX = "harness/"
FILE_BUILDERS = ("json", "csv", "parquet", "arrow", "text")
EXAMPLE = ("a task YAML in eval.harness.include_path=DIR with dataset_path: json and dataset_kwargs: {data_files: "
           "{test: /abs/path/test.jsonl}}")


def section(cfg: Any) -> Any:
    """cfg.eval.harness, or None for a config written before the key existed."""
    e = cfg.get("eval") if hasattr(cfg, "get") else getattr(cfg, "eval", None)
    return None if e is None else e.get("harness")


def tasks(cfg: Any) -> list[str]:
    h = section(cfg)
    return [str(t) for t in (h.get("tasks") or [])] if h is not None else []


def limit(cfg: Any) -> int | float | None:
    """lm_eval's limit: a document count (an int), a fraction of each task's documents (below 1), or None."""
    raw = section(cfg).get("limit")
    if raw is None:
        return None
    value = float(raw)
    if value >= 1:
        if value != int(value):
            raise ConfigError(f"eval.harness.limit={raw}: give a whole number of documents (1 or more) or a "
                              "fraction below 1")
        return int(value)
    return value


def result_values(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm_eval's results["results"] ({TASK: {"acc,none": 0.9, "acc_stderr,none": 0.01, "alias": ...}}) as our
    keys: harness/TASK/acc, harness/TASK/acc_stderr; a filter other than `none` stays (`exact_match,strict`).
    A value that is not a number (lm_eval's "N/A" stderr) is left out."""
    out: dict[str, float] = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            metric, _, filt = key.partition(",")
            out[f"{PREFIX}{task}/{metric}" + ("" if filt == "none" else f",{filt}")] = float(value)
    return out


CHANCE = "chance"  # harness/TASK/chance: a multiple-choice task's chance accuracy (no score: drawn as a line)


def scores(row: dict[str, Any]) -> dict[str, float]:
    """A row's harness scores without their stderrs (nor a task's chance level): {TASK/METRIC: value}."""
    return {k[len(PREFIX):]: v for k, v in row.items()
            if k.startswith(PREFIX) and "_stderr" not in k and not k.endswith(f"/{CHANCE}")
            and isinstance(v, int | float)}


def describe(values: dict[str, float]) -> str:
    """`pattern/acc 0.9400 ± 0.0240` for each score, its stderr when known."""
    parts = []
    for key, value in scores(values).items():
        metric, _, filt = key.rpartition("/")[2].partition(",")
        stderr = values.get(f"{PREFIX}{key.rpartition('/')[0]}/{metric}_stderr" + (f",{filt}" if filt else ""))
        parts.append(f"{key} {value:.4f}" + (f" ± {stderr:.4f}" if isinstance(stderr, float) and
                                             math.isfinite(stderr) else ""))
    return ", ".join(parts)


def check_harness(cfg: Any, standalone: bool = False) -> None:
    """Launch-time refusals, one line each. `standalone`: launcher.evaluate, which scores whether or not the run
    validates; a training launch needs validation on (eval.every or eval.async_jobs) for the tasks to be scored."""
    names = tasks(cfg)
    if not names:
        return
    e = cfg.eval
    if not standalone and int(e.every) == 0 and not bool(e.get("async_jobs")):
        raise ConfigError("eval.harness.tasks are never scored: validation is off (eval.every=0); set eval.every=N "
                          "(or eval.async_jobs=true on a cluster), or score checkpoints later with "
                          "python -m launcher.evaluate RUN_DIR --all")
    if int(cfg.parallel.pp) > 1:
        raise ConfigError(f"eval.harness.tasks with parallel.pp={cfg.parallel.pp}: harness requests run the whole "
                          "model's forward on each rank, which a pipeline stage does not hold; train with "
                          "parallel.pp=1, or drop eval.harness.tasks")
    limit(cfg)
    from contract.data.run_tokenizer import run_tokenizer

    tokenizer, why = run_tokenizer(cfg.data)
    if tokenizer is None:
        raise ConfigError(f"eval.harness.tasks need the run's tokenizer (tasks are text) and there is none: {why}; "
                          "train on a prepared dataset (python -m launcher.prepare ... --tokenizer T, data=tokens "
                          "data.path=DIR)")
    include = section(cfg).get("include_path")
    if include and not Path(str(include)).is_dir():
        raise ConfigError(f"eval.harness.include_path={include} is not a directory: give the directory that holds "
                          "your task YAMLs")
    index = TaskLookup(str(include) if include else None)
    for name in names:
        for task, config in index.leaves(name):
            _check_data(task, config)


class TaskLookup:
    """Task, group and tag names as lm_eval resolves them: the include path's YAMLs first (they win, as in
    lm_eval's TaskManager), lm_eval's own only when a name is not there (indexing those takes seconds)."""

    def __init__(self, include_path: str | None) -> None:
        self.include = task_index(include_path) if include_path else {}

    def entry(self, name: str, asked: str) -> Any:
        found = self.include.get(name) or task_index(None).get(name)
        if found is None:
            known = list(self.include) + list(task_index(None))
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            where = "eval.harness.include_path's YAMLs or lm_eval's own tasks" if self.include else \
                "lm_eval's own tasks (set eval.harness.include_path=DIR for YAMLs of your own)"
            raise ConfigError(f"eval.harness.tasks names {asked}, which is not a task, group or tag of {where}: "
                              f"{hint}check the name, or write {EXAMPLE}")
        return found

    def leaves(self, name: str, asked: str | None = None, depth: int = 0) -> list[tuple[str, dict[str, Any]]]:
        """(task name, its YAML config with includes resolved) of every task the name stands for."""
        from lm_eval.tasks._index import Kind

        asked = asked or name
        entry = self.entry(name, asked)
        if entry.kind == Kind.TAG:
            return [leaf for member in sorted(entry.tags) for leaf in self.leaves(member, asked, depth + 1)]
        if entry.kind == Kind.GROUP and depth < 8:
            out = []
            for child in (entry.cfg or {}).get("task") or []:
                if isinstance(child, dict) and "task" in child and "group" not in child and isinstance(
                        child["task"], str) and child["task"] not in self.include and child["task"] not in task_index(None):
                    out.append((child["task"], child))  # a task defined inline in the group
                elif isinstance(child, dict):
                    out += self.leaves(str(child.get("group") or child.get("task")), asked, depth + 1)
                else:
                    out += self.leaves(str(child), asked, depth + 1)
            return out
        if entry.kind == Kind.PY_TASK:
            raise ConfigError(f"eval.harness.tasks names {asked}: its task {entry.name} is a Python class that reads "
                              f"its data itself, which offline evaluation can't check; write {EXAMPLE}")
        return [(entry.name, dict(entry.cfg or {}))]


@lru_cache(maxsize=8)
def task_index(include_path: str | None) -> dict[str, Any]:
    """lm_eval's task index of one directory (None: its own tasks), built once per process."""
    import logging

    from lm_eval.tasks._index import TaskIndex

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its notes on overridden names are not ours to print
    if include_path is None:
        import lm_eval.tasks

        return TaskIndex.build([Path(lm_eval.tasks.__file__).parent])
    return TaskIndex.build([Path(include_path)])


def _files(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, dict):
        return [f for v in spec.values() for f in _files(v)]
    if isinstance(spec, list | tuple):
        return [f for v in spec for f in _files(v)]
    return []


def _check_data(task: str, config: dict[str, Any]) -> None:
    """The task's dataset is on this disk: a file builder's data_files, or a local directory."""
    if config.get("custom_dataset") is not None:
        return  # the task's own function builds it (lm_eval's custom_dataset): nothing to look at here
    path = config.get("dataset_path")
    kwargs = config.get("dataset_kwargs") or {}
    where = f"eval.harness task {task}"
    if path in FILE_BUILDERS:
        files = _files(kwargs.get("data_files"))
        if not files:
            raise ConfigError(f"{where} reads dataset_path: {path} without data files: add dataset_kwargs: "
                              "{data_files: {test: /abs/path/test.jsonl}} to its YAML")
        for file in files:
            if not Path(file).is_absolute():
                raise ConfigError(f"{where} reads {file}, a relative path, which the ranks would resolve in their own "
                                  "working directory: write it absolute in the task's YAML")
            if not glob.glob(file):
                raise ConfigError(f"{where} reads {file}, which is not on this disk: write the file there (compute "
                                  "nodes read it as it is; nothing is downloaded), or fix data_files in its YAML")
        return
    if isinstance(path, str) and Path(path).is_absolute():
        local = Path(path)
        if not local.is_dir():
            raise ConfigError(f"{where} reads dataset_path: {path}, which is not a directory on this disk: "
                              "save the dataset there (DatasetDict.save_to_disk) or fix dataset_path")
        if (local / "state.json").is_file():
            raise ConfigError(f"{where} reads {path}, a single Dataset saved with save_to_disk, which has no "
                              "splits: save a DatasetDict of its splits there, DatasetDict({'test': ds}).save_to_disk(DIR)")
        return
    raise ConfigError(f"{where} reads {path!r} from the Hugging Face Hub, and evaluation runs offline (nothing is "
                      f"downloaded on compute nodes): save it on disk (load_dataset(...).save_to_disk(DIR), then "
                      f"dataset_path: DIR in a task YAML of your own), or write {EXAMPLE}")
