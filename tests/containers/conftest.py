"""The containers tier: real container runtimes on the test image of `make containers-up`.

Charliecloud (`ch-run` on the image directory), enroot (the `.sqsh`), Podman (`localhost/slurmtrain-test`) and pyxis
(`srun --container-image` on the local SLURM cluster). A runtime or an image that is missing skips its tests locally
and fails them in CI (`CI` set), as tests/conftest.py treats the slurm tier. The image paths are fixed
(scripts/containers/images.sh writes them and their manifest, images.json); the fixtures below expose them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import slurm_available

STATE = Path(os.environ.get("SLURMTRAIN_CONTAINERS_DIR", "/var/tmp/slurmtrain-containers"))
IMAGES = STATE / "images"
MANIFEST = IMAGES / "images.json"
# The runtimes this machine runs (Apptainer cannot be installed here: its command line is checked, not run).
RUNTIMES = ("charliecloud", "enroot", "podman", "pyxis")
SETUP = "run `make containers-up`"


@dataclass(frozen=True)
class ContainerImages:
    """The test image in each runtime's form, and what scripts/containers/images.sh recorded about it."""

    directory: Path  # Charliecloud: ch-run DIRECTORY
    squashfs: Path  # enroot and pyxis: enroot start / srun --container-image=SQUASHFS
    podman: str  # Podman: podman run REF
    python: str  # the interpreter inside the image that has torch and slurmtrain
    slurmtrain_version: str  # slurmtrain's version inside the image
    torch_version: str  # torch's version inside the image
    manifest: dict


@functools.lru_cache(maxsize=1)
def load_images() -> ContainerImages | None:
    """The manifest's images, or None when `make containers-up` has not built them."""
    try:
        m = json.loads(MANIFEST.read_text())
        return ContainerImages(
            directory=Path(m["images"]["directory"]), squashfs=Path(m["images"]["squashfs"]),
            podman=m["images"]["podman"], python=m["python"], slurmtrain_version=m["slurmtrain_version"],
            torch_version=m["torch_version"], manifest=m,
        )
    except (OSError, ValueError, KeyError):
        return None


def _ok(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


@functools.cache
def runtime_problem(runtime: str) -> str | None:
    """Why RUNTIME cannot run the test image here (None: it can). Probes the tools and images, starts nothing."""
    images = load_images()
    if images is None:
        return f"no test image manifest at {MANIFEST}: {SETUP}"
    if runtime == "charliecloud":
        if shutil.which("ch-run") is None:
            return f"ch-run is not installed: {SETUP}"
        if not (images.directory / "usr" / "bin" / "python3").exists():
            return f"no image directory at {images.directory}: {SETUP}"
    elif runtime in ("enroot", "pyxis"):
        if shutil.which("enroot") is None:
            return f"enroot is not installed: {SETUP}"
        if not images.squashfs.is_file():
            return f"no image at {images.squashfs}: {SETUP}"
        if runtime == "pyxis":
            if not slurm_available():
                return "no local SLURM cluster: run `make slurm-up`, then `make containers-up`"
            helped = _ok(["srun", "--help"])
            if helped is None or "--container-image" not in helped.stdout + helped.stderr:
                return f"pyxis is not loaded in the local SLURM cluster (srun --help shows no --container-image): {SETUP}"
    elif runtime == "podman":
        if shutil.which("podman") is None:
            return f"podman is not installed: {SETUP}"
        found = _ok(["podman", "image", "exists", images.podman])
        if found is None or found.returncode != 0:
            return f"no Podman image {images.podman}: {SETUP}"
    else:
        return f"unknown runtime {runtime!r} (this tier knows {', '.join(RUNTIMES)})"
    return None


def need_runtime(runtime: str) -> ContainerImages:
    """The images, when RUNTIME can run them here; otherwise the test is skipped (locally) or fails (in CI)."""
    problem = runtime_problem(runtime)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the containers tier but {runtime} cannot: {problem}")
        pytest.skip(problem)
    images = load_images()
    assert images is not None
    return images


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containers: tests on real container runtimes (make containers-up)")


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.containers)


@pytest.fixture(scope="session")
def container_images() -> ContainerImages:
    """The test image's paths and manifest; skipped locally (failing in CI) when `make containers-up` has not run."""
    images = load_images()
    if images is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the containers tier but there is no {MANIFEST}: {SETUP}")
        pytest.skip(f"no test image manifest at {MANIFEST}: {SETUP}")
    return images


@pytest.fixture(scope="session")
def container_runtimes() -> frozenset[str]:
    """The runtimes that can run the test image here (a subset of RUNTIMES)."""
    return frozenset(r for r in RUNTIMES if runtime_problem(r) is None)
