"""Login-node side of slurmtrain: compose, validate, plan, dispatch. Never imports torch at import time.

What a user or a job types, and the foundations everything imports, are at the top; the rest is grouped by stage:

    __main__.py   python -m launcher [overrides]: compose -> check -> plan -> run (locally or on SLURM)
    status.py     python -m launcher.status: a table with one row per run (of a run, a sweep or a run root)
    report.py     python -m launcher.report: PNG plots of a run, a sweep or a run root
    export.py     python -m launcher.export: a checkpoint as safetensors or a Hugging Face model
    sample.py     python -m launcher.sample: text from a checkpoint
    evaluate.py   python -m launcher.evaluate: validation sets and harness tasks on chosen checkpoints
    prepare/      python -m launcher.prepare: a corpus -> token shards, locally or as a SLURM array
    worker.py     python -m launcher.worker: the compute side's entry as local workers, sbatch and submitit start it
    commands.py   the commands above, one line each, and their parsers (--help, the site's command reference)
    help.py       python -m launcher --help: what slurmtrain is, the config groups, the commands
    compose.py    the config composed outside `python -m launcher` (tests, benchmarks, notebooks)
    config_store.py  the schema (contract/config/schema.py) and our Hydra plugin registered with Hydra
    compute_seam.py  the one door into train/, for export, sample and the worker (import-linter allows no other)
    terminal.py   standard output and error that outlive a closed terminal (the launcher's and the ranks')
    checks/       refusals before anything runs: keys, inputs, cluster, Hydra's errors, resuming a run directory
    plan/         the launch plan: world size, layout, memory, strategy, learning rate, budget, weights
    run/          where a run goes and how it starts: dispatch, local workers, SLURM, the run directory, eval jobs,
                  a login node over SSH (run/remote/: +remote=NAME)
    sweeps/       `-m` sweeps as SLURM job arrays (the Hydra launcher plugin)
    observe/      what runs leave behind, read for status and report: runs, their rows, validation losses
    docs/         the documentation site's generated parts (make docs): references, a showcase run, MkDocs hooks

Each package's __init__ maps its modules and imports nothing, so importing one module loads only what it needs.
The packages' modules import each other and the contract (contract/), never status, report, export or sample,
and never train/ (only compute_seam.py does).

Importing it first makes our compute-side package `train` win over a user's own `train.py` (or `train/`) in the
working directory, which Python would otherwise find first: the launcher runs from the user's project directory,
whatever files it holds. The user's other modules stay importable from there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def _prefer_our_train_package() -> None:
    ours = _ROOT / "train"
    if not (ours / "__init__.py").is_file():
        return
    loaded = sys.modules.get("train")
    try:
        spec = importlib.util.find_spec("train") if loaded is None else loaded.__spec__
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is not None and ours in origin.parents:
        return
    sys.path.insert(0, str(_ROOT))
    for name in [m for m in sys.modules if m == "train" or m.startswith("train.")]:
        del sys.modules[name]


_prefer_our_train_package()
