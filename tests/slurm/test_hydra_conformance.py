"""Hydra's own launcher conformance suites against `hydra/launcher=slurmtrain` on the real local cluster.

The same way Hydra tests its submitit plugin: `LauncherTestSuite` runs sweeps in this process (the app's task
function goes to SLURM as array tasks and the JobReturns come back), `IntegrationTestSuite` runs small Hydra apps
as subprocesses with `-m`. The fixtures they use (`hydra_sweep_runner`, `hydra_restore_singletons`) come from
Hydra's pytest plugin, which hydra-core registers through the `pytest11` entry point `hydra_pytest` (so no
`pytest_plugins` here: naming the module again would register it twice, which pytest refuses).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import DictConfig

from hydra_plugins.slurmtrain_launcher import SlurmtrainLauncher

pytestmark = pytest.mark.slurm

# Generic (non-training) apps, following the array: Hydra's contract is that the launcher returns JobReturns.
SLURM_OVERRIDES = ["hydra.launcher.partition=debug", "hydra.launcher.wait=true", "hydra.launcher.time_min=5"]


def test_discovery() -> None:
    # The plugin is found by the plugins subsystem when Hydra looks for Launchers.
    assert SlurmtrainLauncher.__name__ in [cls.__name__ for cls in Plugins.instance().discover(Launcher)]


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_batch_is_one_slurm_array(hydra_sweep_runner: TSweepRunner, tmp_path: Path) -> None:
    # The suites only check that hydra.job.id is set; this pins down that the jobs really ran as one array.
    def task(_: DictConfig) -> tuple[str, str]:
        return os.environ["SLURM_ARRAY_JOB_ID"], os.environ["SLURM_ARRAY_TASK_ID"]

    sweep = hydra_sweep_runner(
        calling_file=None, calling_module="hydra.test_utils.a_module", task_function=task,
        config_path="configs", config_name="compose",
        overrides=["hydra/launcher=slurmtrain", *SLURM_OVERRIDES, "+a=0,1"], temp_dir=tmp_path,
    )
    with sweep:
        assert sweep.returns is not None
        first, second = sweep.returns[0]
        array_id = first.return_value[0]
        assert [first.return_value, second.return_value] == [(array_id, "0"), (array_id, "1")]
        assert [first.hydra_cfg.hydra.job.id, second.hydra_cfg.hydra.job.id] == [f"{array_id}_0", f"{array_id}_1"]


@pytest.mark.parametrize("launcher_name, overrides", [("slurmtrain", SLURM_OVERRIDES)])
class TestSlurmtrainLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/hydra_logging=disabled", "hydra/job_logging=disabled", "hydra/launcher=slurmtrain",
           *SLURM_OVERRIDES])],
)
class TestSlurmtrainLauncherIntegration(IntegrationTestSuite):
    pass
