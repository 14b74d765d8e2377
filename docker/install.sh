#!/bin/sh
# slurmtrain into an image, beside the base image's torch (docker/Dockerfile and docker/slurmtrain.def run this):
# its dependencies less torch (docker/deps.py), then slurmtrain itself without dependencies.
set -eu
src=${1:-/opt/slurmtrain-src}
python "$src/docker/deps.py" "$src/pyproject.toml" > /tmp/slurmtrain-deps.txt
python -m pip install --no-cache-dir -r /tmp/slurmtrain-deps.txt
python -m pip install --no-cache-dir --no-deps "$src"
python -c "import importlib.metadata as m, torch, launcher.worker; print('slurmtrain', m.version('slurmtrain'), 'torch', torch.__version__)"
