"""Each runtime here starts the test image of `make containers-up`, and the Python inside is the environment: it
imports torch and slurmtrain's own copy (not a mount of this checkout) at the versions the launcher side has."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess

import pytest

from tests.containers.conftest import RUNTIMES, ContainerImages, need_runtime

PROBE = (
    "import importlib.metadata as m, launcher, torch; "
    "print(m.version('slurmtrain'), torch.__version__, launcher.__file__)"
)
SITE = "/usr/local/lib/python3.11/dist-packages/"


def runtime_argv(runtime: str, images: ContainerImages, *cmd: str) -> list[str]:
    """The plain runtime command line that starts CMD in the test image (the product renders its own)."""
    if runtime == "charliecloud":
        # ch-run passes the host's environment in: pass only PATH.
        return ["ch-run", "--unset-env=*", "--set-env=PATH=/usr/local/bin:/usr/bin:/bin", str(images.directory), "--", *cmd]
    if runtime == "enroot":
        return ["enroot", "start", str(images.squashfs), *cmd]
    if runtime == "podman":
        return ["podman", "run", "--rm", images.podman, *cmd]
    if runtime == "pyxis":
        return ["srun", "-N1", "-n1", "-t", "5", "-J", "containers-smoke", f"--container-image={images.squashfs}", *cmd]
    raise ValueError(runtime)


def bare_env() -> dict[str, str]:
    """What a fresh login passes on: no PYTHONPATH or virtualenv of the test process."""
    keep = ("PATH", "HOME", "USER", "LANG", "SLURM_CONF")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("USER", "root")  # ch-run refuses to start without $USER
    env["PATH"] = "/usr/local/bin:" + env.get("PATH", "/usr/bin:/bin")
    return env


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_runs_with_this_slurmtrain_and_torch(runtime: str) -> None:
    images = need_runtime(runtime)
    out = subprocess.run(
        runtime_argv(runtime, images, images.python, "-c", PROBE),
        env=bare_env(), cwd="/", capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, f"{runtime} could not start the image:\n{out.stdout}\n{out.stderr}"
    version, torch_version, launcher_file = out.stdout.strip().splitlines()[-1].split()
    expected = importlib.metadata.version("slurmtrain")
    assert version == expected, f"slurmtrain {version} inside the image, {expected} on the launcher side: make containers-up"
    assert torch_version == importlib.metadata.version("torch"), "the image's torch is not the launcher side's"
    assert launcher_file.startswith(SITE), f"slurmtrain came from {launcher_file}, not the image's own copy"
