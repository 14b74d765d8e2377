"""examples/byo_project on the real local cluster, from an outside directory with its own train.py: its own
cluster YAML, model and data; a sweep over its own hyperparameters is one job array. (Preemption is the same for
any model: tests/slurm/test_requeue.py and test_parallel.py requeue on USR1 and end bitwise.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import sacct_state

pytestmark = pytest.mark.slurm

PROJECT = ["--config-dir", "conf", "model=conv_lm", "data=chars"]


def test_a_sweep_over_the_examples_own_hyperparameters_is_one_array(byo_project: Path, run_root: Path) -> None:
    out = launch("--config-dir", "conf", "-m", "model=conv_lm", "data=chars", "model.args.dim=32,48", "model.args.kernel=2,3", "+cluster=my_cluster",
                 "cluster.nodes=1", "trainer.max_steps=6", "logger.backend=none", f"run.root={hq(run_root)}",
                 "launcher.sweep_name=dims", "launcher.wait=true", cwd=byo_project, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = load_sweep(run_root / "sweeps" / "dims")
    assert len(sweep.arrays) == 1 and sweep.arrays[0].points == [0, 1, 2, 3]
    array_id = sweep.arrays[0].array_id
    assert sacct_state(f"{array_id}_3") == "COMPLETED"
    dims = set()
    for point in sweep.points:
        cfg = OmegaConf.load(Path(point.run_dir) / "config.yaml")
        dims.add((cfg.model.args.dim, cfg.model.args.kernel))
        assert read_metrics(Path(point.run_dir))[-1]["step"] == 6
    assert dims == {(32, 2), (32, 3), (48, 2), (48, 3)}
