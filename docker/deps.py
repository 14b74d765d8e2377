"""slurmtrain's runtime dependencies from pyproject.toml, less torch: what an image installs beside its base image's
own torch (a CUDA build, often a pre-release version string that `torch>=2.4` would not accept, so pip would
replace it). Python 3.8+ without third-party packages (the base image's Python): `python docker/deps.py
pyproject.toml` prints them, one per line."""

import re
import sys


def dependencies(pyproject_text: str) -> list[str]:
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject_text, re.S | re.M)
    if block is None:
        raise SystemExit("no dependencies = [...] in pyproject.toml")
    found = re.findall(r'^\s*"([^"]+)"', block.group(1), re.M)
    return [d for d in found if not re.match(r"torch\b", d)]


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml") as f:
        print("\n".join(dependencies(f.read())))
