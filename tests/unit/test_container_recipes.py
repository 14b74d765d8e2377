"""The image recipes (docker/Dockerfile, docker/slurmtrain.def) install slurmtrain beside the base image's torch:
docker/deps.py must list every dependency pyproject.toml declares but torch. Neither recipe is built here (no Docker,
no Apptainer on the test machines): what they copy must exist, and both run the same install script."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

from tests.conftest import ROOT


def test_deps_are_pyprojects_less_torch():
    # The installed slurmtrain's requirements less its extras': pyproject.toml's dependencies, as pip read them.
    declared = [r for r in metadata.requires("slurmtrain") or [] if "extra ==" not in r]
    out = subprocess.run([sys.executable, str(ROOT / "docker" / "deps.py"), str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, check=True).stdout.split()
    norm = [re.sub(r"\s+", "", d) for d in declared]
    assert [re.sub(r"\s+", "", d) for d in out] == [d for d in norm if not re.match(r"torch\b", d)]
    assert any(d.startswith("torch") for d in declared) and not any(d.startswith("torch") for d in out)


def test_recipes_copy_what_exists_and_share_the_install():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    definition = (ROOT / "docker" / "slurmtrain.def").read_text()
    copied = re.findall(r"^COPY (.+?) \S+$", dockerfile, re.M)
    files = [line.split()[0] for line in definition.split("%files", 1)[1].split("%post", 1)[0].splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    for source in [word for line in copied for word in line.split()] + files:
        assert (ROOT / source).exists(), source
    assert "docker/install.sh" in dockerfile and "docker/install.sh" in definition
    for package in ("contract", "launcher", "train"):
        assert package in copied[0] + " ".join(copied) and any(f == package for f in files)
