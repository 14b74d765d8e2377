"""The one door from launcher/ into train/: the only launcher module that imports the compute side (import-linter
lets it, and no other; `make lint`).

Why a login-side package reaches the compute side at all: a few commands run the model in the process where they
are typed, with no job around them, and one entry lives under `launcher` for its name:
    export      launcher/export.py consolidates a checkpoint's weights (any strategy, any world size) into one file,
                or a verified Hugging Face directory
    sample      launcher/sample.py generates from a checkpoint on this machine
    evaluate    launcher/evaluate.py submits evaluation jobs of its own (the sbatch call training's rank 0 makes)
    the worker  launcher/worker.py is the compute-side entry as we start it (local workers, submitit's pickled
                `launcher.worker.run`, the sbatch scripts, evaluation jobs, a replica group's batch shell after srun);
                going through `launcher` keeps our `train`
                package ahead of a user's own train.py in the working directory
Each function imports train/ only when called, so importing this module never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def train(config_path: str | Path) -> int:
    """One rank of a run from its resolved config (train/entry.py)."""
    from train.entry import run

    return run(config_path)


def train_main(argv: list[str]) -> int:
    from train.entry import main

    return main(argv)


def preload() -> None:
    """Import what every rank of a run imports, in the process local ranks are forked from
    (launcher/run/rank_fork.py)."""
    from train.entry import preload

    preload()


def group_ended(run_dir: str, code: int) -> int:
    """A replica group's array task after srun ended with `code` (train/replicas/task_end.py: requeue it alone)."""
    from train.replicas.task_end import group_ended

    return group_ended(run_dir, code)


def probe_main() -> int:
    """The launch probe of a user's model (train/model/probe.py), request on stdin."""
    from train.model.probe import main

    return main()


def evaluate(run_dir: str, step: int, config: str | None = None) -> int:
    """One rank of an evaluation job (train/evaluation/job.py); `config`: launcher.evaluate's."""
    from train.evaluation.job import run

    return run(run_dir, step, config)


def submit_evaluation(cfg: Any, run_dir: Path, step: int, config: Path) -> str:
    """sbatch an evaluation job of step N with launcher.evaluate's config (train/evaluation/submit.py, torch-free)."""
    from train.evaluation.submit import submit_evaluation

    return submit_evaluation(cfg, run_dir, step, config)


def init_from_main() -> int:
    """Whether model.init_from's weights fit the model (train/weights/init_weights.py), request on stdin."""
    from train.weights.init_weights import main

    return main()


def sampling() -> ModuleType:
    """train/model/sample.py: Sampling and sample(), for launcher/sample.py."""
    from train.model import sample

    return sample


def weights_export() -> ModuleType:
    """train/weights/export.py: a checkpoint's weights consolidated and written, for launcher/export.py."""
    from train.weights import export

    return export


def hf_export() -> ModuleType:
    """train/weights/hf_export.py: a checkpoint's weights as a verified Hugging Face directory."""
    from train.weights import hf_export

    return hf_export
