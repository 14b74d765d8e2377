"""The compute-side entry as we start it (local workers, submitit's pickled callable, the sbatch scripts):

    python -m launcher.worker --config RUN_DIR/config.yaml
    python -m launcher.worker --probe  < request.json     (launcher/plan/probe.py: what a user's model is made of)
    python -m launcher.worker --evaluate RUN_DIR STEP     (an evaluation job's rank: train/evaluation/job.py)
    python -m launcher.worker --init-from < request.json  (launcher/plan/init_from.py: do model.init_from's weights fit)

Going through `launcher` first (see launcher/__init__.py) keeps our `train` package ahead of a user's own train.py
in the working directory; the work itself is train.entry's.
"""

from __future__ import annotations

import sys
from pathlib import Path


def run(config_path: str | Path) -> int:
    from train.entry import run as train_run

    return train_run(config_path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        from train.probe import main as probe_main

        return probe_main()
    if argv[:1] == ["--evaluate"] and len(argv) == 3:
        from train.evaluation.job import run as evaluate

        return evaluate(argv[1], int(argv[2]))
    if argv[:1] == ["--init-from"]:
        from train.init_weights import main as init_from_main

        return init_from_main()
    from train.entry import main as train_main

    return train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
