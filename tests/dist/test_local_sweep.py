"""`-m` without +cluster: the points train here one after another, a summary table ends the sweep, the same
sweep command skips finished points, and a failed point makes the sweep fail without stopping the others."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.dist


def _files(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_local_sweep_runs_each_point_and_resumes_as_a_whole(run_root: Path) -> None:
    # From a project directory with its own train.py: our workers must still run our training package.
    (run_root / "train.py").write_text('raise SystemExit("the user\'s train.py was imported")\n')
    args = ["-m", "optim.lr=1e-3,3e-3", "trainer.max_steps=6", "trainer.log_every=3", "local.nproc=2",
            "logger.backend=none", f"run.root={hq(run_root)}", "launcher.sweep_name=local lr"]
    out = launch(*args, cwd=run_root)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = load_sweep(run_root / "sweeps" / "local lr")
    assert [p.overrides[0] for p in sweep.points] == ["optim.lr=0.001", "optim.lr=0.003"] and sweep.swept == ["optim.lr"]
    finals = []
    for p in sweep.points:
        rows = read_metrics(Path(p.run_dir))
        assert [r["step"] for r in rows] == [1, 3, 6]
        finals.append(rows[-1]["loss"])
        assert f"{rows[-1]['loss']:.4f}" in out.stderr  # the summary table's final loss column
        # Its own wandb run (its own run directory and id), grouped by the sweep's name.
        assert OmegaConf.load(Path(p.run_dir) / "config.yaml").logger.group == "local lr"
    assert finals[0] != finals[1]
    assert out.stderr.count("finished") >= 2 and "sweep local lr" in out.stderr

    before = {p.run_dir: _files(Path(p.run_dir)) for p in sweep.points}
    again = launch(*args, cwd=run_root)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("finished at step 6: skipped") == 2
    assert "launcher: started" not in again.stderr  # no worker started
    assert {p.run_dir: _files(Path(p.run_dir)) for p in sweep.points} == before


def test_a_failed_point_fails_the_sweep_after_the_others_ran(run_root: Path) -> None:
    # Point 0 ("bad") raises in its step 2 (an injected crash); point 1 trains.
    out = launch("-m", "run.name=bad,good", "trainer.max_steps=2", "local.nproc=1", "logger.backend=none",
                 f"run.root={hq(run_root)}", cwd=run_root, SLURMTRAIN_TEST_RAISE="0:2", SLURMTRAIN_TEST_ONLY_IN="bad")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "failed (exit" in out.stderr
    sweep = load_sweep(next((run_root / "sweeps").iterdir()))
    assert [r["step"] for r in read_metrics(Path(sweep.points[1].run_dir))] == [1, 2]
