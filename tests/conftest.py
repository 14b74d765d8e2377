"""Shared fixtures and tier gating: slurm tests need `make slurm-up`; gpu tests need CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from contract.rundir.metrics_file import FILE_NAME, decode_row

ROOT = Path(__file__).resolve().parent.parent


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", PYTHONUNBUFFERED="1")
    env.pop("WANDB_API_KEY", None)
    env.update(extra)
    return env


def launch(*overrides: str, cwd: Path | None = None, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m launcher OVERRIDES` as a user would and capture its output: forked from a server that imported
    the launcher and the compute side once (tests/forked_cli.py), whose local ranks the launcher then forks from
    itself (launcher/run/zygote_here.py); a run pays neither interpreter's imports (~8 CPU-seconds here). The tests
    that start `python -m launcher` themselves (a Popen they signal, tests/unit/test_bad_inputs.py's real interpreters,
    the documentation's commands) keep the fresh interpreter and zygote covered."""
    from tests.forked_cli import RUN_PRELOAD, run_module

    return run_module("launcher", overrides, cwd=cwd or ROOT, env=launcher_env(**env), timeout=timeout,
                      preload=RUN_PRELOAD)


def hq(value: object) -> str:
    """Quote a value for a Hydra override (paths with spaces or quotes), as a user would in the shell."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_metrics(run_dir: Path) -> list[dict]:
    """Every row of RUN_DIR/metrics.jsonl through the file's own decoder; an unparsable line fails the test."""
    return [decode_row(line) for line in (run_dir / FILE_NAME).read_text().splitlines() if line.strip()]


def traced_samples(trace_dir: Path) -> dict[int, list[int]]:
    """step -> every global sample index trained on in that step, over all ranks and world sizes
    (SLURMTRAIN_TRACE_SAMPLES files)."""
    steps: dict[int, list[int]] = {}
    for f in Path(trace_dir).glob("rank*_world*.txt"):
        for line in f.read_text().splitlines():
            step, *indices = map(int, line.split())
            steps.setdefault(step, []).extend(indices)
    return steps


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    # Shell-hostile on purpose: spaces and quotes must survive every layer (argv lists, sbatch, srun).
    root = tmp_path / "runs with space's"
    root.mkdir()
    return root


def slurm_available() -> bool:
    if shutil.which("scontrol") is None:
        return False
    try:
        return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# `make test` runs the tiers on pytest-xdist workers (--dist loadgroup): a test file is one unit of work (its
# module-scoped set-up runs once), and the slurm tier is one unit, in order, since its tests share the cluster's three
# nodes; so is the containers tier (tests/containers: real runtimes, pyxis jobs on the same cluster), which can run
# beside it on another worker. The slurm and containers units go first, being the longest, and the dist files before
# the unit files, so that the short unit files fill the end.
TIER_ORDER = {"slurm": 0, "containers": 0, "dist": 1, "gpu": 2, "unit": 3}
ONE_UNIT_TIERS = ("slurm", "containers")


def _work_unit(item: pytest.Item) -> tuple[int, str]:
    path = item.nodeid.split("::")[0]
    tier = Path(path).parent.name
    return TIER_ORDER.get(tier, len(TIER_ORDER)), tier if tier in ONE_UNIT_TIERS else path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    units = {id(item): _work_unit(item) for item in items}
    items.sort(key=lambda item: units[id(item)][0])  # stable: each file keeps its order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(units[id(item)][1]))
    need_slurm = any("slurm" in item.keywords for item in items)
    has_slurm = slurm_available() if need_slurm else False
    has_cuda = cuda_available() if any("gpu" in item.keywords for item in items) else False
    for item in items:
        if "slurm" in item.keywords and not has_slurm:
            if os.environ.get("CI"):
                # In CI the cluster is part of the contract: a missing cluster is a failure, not a skip.
                item.add_marker(pytest.mark.slurm_missing)
            else:
                item.add_marker(pytest.mark.skip(reason="no local SLURM cluster: run `make slurm-up`"))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="no CUDA device on this machine"))


@pytest.fixture(autouse=True)
def _fail_without_slurm_in_ci(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("slurm_missing"):
        pytest.fail("CI must run the slurm tier but no SLURM cluster answers `scontrol ping`: run `make slurm-up`")


EXAMPLE = ROOT / "examples" / "byo_project"


def copy_example(dest: Path) -> Path:
    """examples/byo_project as a user has it: an outside directory (shell-hostile path) with its own train.py,
    model.py, data.py and conf/."""
    project = dest / "my project's dir"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    return project


@pytest.fixture(scope="module")
def byo_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example(tmp_path_factory.mktemp("byo"))
