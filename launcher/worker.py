"""The compute-side entry as we start it (local workers, submitit's pickled callable, the sbatch scripts):

    python -m launcher.worker --config RUN_DIR/config.yaml
    python -m launcher.worker --probe  < request.json     (launcher/plan/probe.py: what a user's model is made of)
    python -m launcher.worker --evaluate RUN_DIR STEP [CONFIG]  (an evaluation job's rank: train/evaluation/job.py;
                                                           CONFIG: launcher.evaluate's, else the checkpoint's)
    python -m launcher.worker --init-from < request.json  (launcher/plan/init_from.py: do model.init_from's weights fit)
    python -m launcher.worker --fork-ranks FD             (launcher/run/rank_fork.py: imports once, forks the local
                                                           ranks, each then runs as `--config` above)
    python -m launcher.worker --group-ended RUN_DIR CODE  (a replica group's batch shell after srun ended with CODE:
                                                           train/replicas/task_end.py requeues its array task)

Going through `launcher` first (see launcher/__init__.py) keeps our `train` package ahead of a user's own train.py
in the working directory; the work itself is train.entry's, reached through launcher/compute_seam.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher import compute_seam


def run(config_path: str | Path) -> int:
    return compute_seam.train(config_path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        # Every way the worker is started, --evaluate's included (train.entry's own parser knows only --config).
        print(__doc__.rstrip())
        return 0
    if argv[:1] == ["--probe"]:
        return compute_seam.probe_main()
    if argv[:1] == ["--evaluate"] and len(argv) in (3, 4):
        return compute_seam.evaluate(argv[1], int(argv[2]), argv[3] if len(argv) == 4 else None)
    if argv[:1] == ["--group-ended"] and len(argv) == 3:
        return compute_seam.group_ended(argv[1], int(argv[2]))
    if argv[:1] == ["--init-from"]:
        return compute_seam.init_from_main()
    if argv[:1] == ["--fork-ranks"] and len(argv) == 2:
        from launcher.run import rank_fork

        return main(rank_fork.serve(int(argv[1]), compute_seam.preload))  # returns in each forked rank only
    return compute_seam.train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
