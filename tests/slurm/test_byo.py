"""examples/byo_project on the real local cluster, from an outside directory with its own train.py: its own
cluster YAML, model and data; a USR1 preemption requeues it and it ends bitwise where an uninterrupted run ends;
a sweep over its own hyperparameters is one job array."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.sweepdir import load_sweep
from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import preempt_and_release, sacct_state, submitted_job_id

pytestmark = pytest.mark.slurm

STEPS = 50
PROJECT = ["--config-dir", "conf", "model=conv_lm", "data=chars"]


def test_the_example_requeues_on_usr1_and_ends_where_an_uninterrupted_run_ends(byo_project: Path,
                                                                                run_root: Path) -> None:
    common = [*PROJECT, "strategy=fsdp", f"trainer.max_steps={STEPS}", "trainer.log_every=1",
              "trainer.ckpt_every=0", f"run.root={hq(run_root)}"]
    out = launch(*common, "+cluster=my_cluster", "run.name=pre", cwd=byo_project)
    assert out.returncode == 0, out.stderr[-3000:]
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "pre"
    assert preempt_and_release(job_id, run_dir) == "COMPLETED"
    history = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-o", "State"], capture_output=True,
                             text=True).stdout.split()
    assert "REQUEUED" in history, history
    cfg = OmegaConf.load(run_dir / "config.yaml")
    assert cfg.cluster.name == "my_cluster" and cfg.model._target_ == "model.ConvLM"

    reference = launch(*common, "local.nproc=2", "run.name=ref", cwd=byo_project)
    assert reference.returncode == 0, reference.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(run_root / "ref")]


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
