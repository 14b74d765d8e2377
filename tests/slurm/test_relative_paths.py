"""A job submitted with relative paths trains when its working directory is not the launch directory (an sbatch
--chdir): config.yaml holds them absolute (launcher/plan/paths.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import sacct_state, submitted_job_id

pytestmark = pytest.mark.slurm


def test_a_job_elsewhere_reads_the_launch_directorys_data(tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "launch dir's", tmp_path / "job dir"
    (here / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (np.arange(20000) % 256).astype(np.uint16).tofile(here / "data" / "tok.bin")
    out = launch("+cluster=local_slurm", f"+cluster.extra_sbatch.chdir={hq(elsewhere)}", "launcher.wait=true",
                 "data=tokens", "data.path=data/tok.bin", "trainer.max_steps=3", "logger.backend=none",
                 "run.root=runs", "run.name=r", cwd=here)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sacct_state(submitted_job_id(out.stdout)) == "COMPLETED"
    assert read_metrics(here / "runs" / "r")[-1]["step"] == 3
    assert not (elsewhere / "runs").exists()
