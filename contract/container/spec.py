"""A config's container section made concrete: the image, every mount, the variables set inside, the working
directory, the extra flags, and the names a runtime gives its unpacked copy (enroot, pyxis). Torch-free; the
launcher settles container.code and container.auto_mounts before config.yaml is written
(launcher/checks/containers.py), so that the compute side renders the same command lines from config.yaml alone."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from contract.container.mounts import Mount, all_mounts, checkout_mount, source_checkout

# Set inside every container slurmtrain starts: a process there (a search worker starting its trial's ranks) runs
# its children directly, never through the runtime again.
IN_CONTAINER_ENV = "SLURMTRAIN_CONTAINER"
# Host variables the ranks read, passed into runtimes that start from a clean environment (enroot, podman): a name
# ending in `_` is a prefix, any other one exact.
PASSED_ENV = ("SLURM_", "SLURMD_NODENAME", "SLURMTRAIN_", "SUBMITIT_", "MASTER_ADDR", "MASTER_PORT", "RANK",
              "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "WANDB_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_",
              "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HF_", "PYTHONUNBUFFERED")


def passed(name: str) -> bool:
    return any(name.startswith(p) if p.endswith("_") else name == p for p in PASSED_ENV)


def is_file_image(image: str) -> bool:
    """An image named by a path (a .sqsh, .sif or directory) rather than a registry reference."""
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".sif", ".squashfs", ".simg"))


def image_stamp(image: str) -> str:
    """What identifies the image's content cheaply: a file's size and mtime, a reference's own text."""
    path = os.path.expanduser(image)
    try:
        st = os.stat(path)
        return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return image


@dataclass(frozen=True)
class Spec:
    runtime: str
    image: str
    python: str
    mounts: tuple[Mount, ...]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    flags: tuple[str, ...] = ()
    gpus: bool = False
    remap_root: bool = False
    mount_home: bool = False

    @property
    def name(self) -> str:
        """The unpacked container's name (enroot create, pyxis --container-name): one per image content, so a
        requeued attempt, and another run of the same image, start the copy already unpacked on a node."""
        return "slurmtrain-" + hashlib.sha256(image_stamp(self.image).encode()).hexdigest()[:12]


def enabled(cfg: Any) -> bool:
    """The config runs its ranks in a container (what a job script renders, wherever it is rendered)."""
    c = cfg.get("container") if hasattr(cfg, "get") else None
    return c is not None and c.runtime != "none"


def inside() -> bool:
    """This process runs in a container slurmtrain started: its children start directly."""
    return bool(os.environ.get(IN_CONTAINER_ENV))


def spec_from_config(cfg: Any, gpus: bool | None = None) -> Spec:
    """cfg.container as a Spec; the working directory defaults to the launching directory (this process's)."""
    c = cfg.container
    checkout = source_checkout() if c.code == "checkout" else None
    auto = list(c.get("auto_mounts") or [])
    mounts = all_mounts(auto, list(c.mounts))
    env = {IN_CONTAINER_ENV: str(c.runtime), **{str(k): str(v) for k, v in c.env.items()}}
    if checkout is not None:
        extra = checkout_mount(str(checkout), str(c.runtime), auto)
        mounts += [extra] if extra is not None else []
        # The checkout's code ahead of the image's installed copy (site-packages comes after PYTHONPATH).
        inside_path = extra.dst if extra is not None else str(checkout)
        env["PYTHONPATH"] = ":".join([inside_path, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    if gpus is None:
        gpus = cfg.get("cluster") is not None and int(cfg.cluster.gpus_per_node or 0) > 0
    return Spec(runtime=str(c.runtime), image=os.path.expanduser(str(c.image)), python=str(c.python),
                mounts=tuple(mounts), env=env, workdir=str(c.workdir or os.getcwd()),
                flags=tuple(str(f) for f in c.flags), gpus=bool(gpus), remap_root=bool(c.remap_root),
                mount_home=bool(c.mount_home))
