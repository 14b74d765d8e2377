"""Local ranks inside a container (container=... without +cluster): each rank starts fresh through the runtime,
`<runtime ...> IMAGE python -m launcher.worker --config ...`, never forked from the launcher's zygote (whose
interpreter is the host's), and rank 0 binds the store's port itself: a listening socket held here does not
cross into every runtime (podman's does not). The launcher itself stays outside, as on a login node.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from contract.container.mounts import Mount
from contract.container.runtimes import wrap
from contract.container.spec import Spec, enabled, inside, spec_from_config
from contract.errors import ConfigError


def spec_for(config_path: Path, gpus: bool, extra_dirs: list[Path]) -> Spec | None:
    """The container the ranks of config.yaml start in (None: none, or already inside one), with `extra_dirs`
    mounted too (the launcher's folder for the ranks' one-line endings)."""
    cfg = OmegaConf.load(config_path)
    if not enabled(cfg) or inside():
        return None
    spec = spec_from_config(cfg, gpus=gpus)
    extra = tuple(Mount(str(d), str(d)) for d in extra_dirs)
    return dataclasses.replace(spec, mounts=spec.mounts + extra)


def prepare(spec: Spec) -> None:
    """enroot starts a container made once from the image (`enroot create`), kept for the next run."""
    if spec.runtime != "enroot":
        return
    listed = subprocess.run(["enroot", "list"], capture_output=True, text=True, timeout=60)
    if spec.name in listed.stdout.split():
        return
    out = subprocess.run(["enroot", "create", "--name", spec.name, spec.image], capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        words = [line for line in out.stderr.splitlines() if line.strip()]
        raise ConfigError(f"enroot create of {spec.image} failed: {(words or ['no message'])[-1].strip()}")


def rank_argv(spec: Spec, worker_argv: list[str]) -> list[str]:
    return [*wrap(spec), "-m", "launcher.worker", *worker_argv]


def free_port() -> int:
    """A port free now, for rank 0 to bind (a small race, which the store's bind would report)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
