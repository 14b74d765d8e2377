"""`container=NAME` (conf/container/NAME.yaml): the image the ranks run in, and how the runtime starts it
(contract/container/ renders the command lines; launcher/checks/containers.py checks them before anything runs)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The runtimes a config can name (conf/container/*.yaml); `none` runs the ranks in the launcher's own environment.
RUNTIMES = ("none", "pyxis", "enroot", "apptainer", "charliecloud", "podman")


@dataclass
class ContainerConfig:
    # Set by the group option (container=pyxis), never typed.
    runtime: str = "none"
    # What the runtime starts: a registry reference (nvcr.io/nvidia/pytorch:24.05-py3, docker://..., for podman a
    # local image name), a .sqsh (enroot, pyxis) or .sif (apptainer) file, or an image directory (charliecloud).
    image: str | None = None
    # More bind mounts, SRC:DST or SRC:DST:ro each. The run root, the data paths, the launching directory (the
    # project's code) are mounted already, each at its own path, and slurmtrain's checkout when it is mounted over
    # the image's copy (at its own path; Charliecloud: at /mnt).
    mounts: list[str] = field(default_factory=list)
    # Variables set inside the container (KEY: VALUE). The ranks' own (SLURM_*, MASTER_*, WANDB_*, NCCL_*, ...)
    # are passed in already.
    env: dict[str, str] = field(default_factory=dict)
    # The ranks' working directory inside the container; None: the directory the launcher runs in.
    workdir: str | None = None
    # Extra runtime flags, placed before the image (pyxis: extra srun flags). Flags slurmtrain sets itself are
    # refused (launcher/checks/containers.py names them).
    flags: list[str] = field(default_factory=list)
    # The interpreter inside the image that has slurmtrain's dependencies (a venv's python, or python3).
    python: str = "python3"
    # Which slurmtrain the ranks run: auto (the image's when it is this launcher's version, else this launcher's
    # source checkout mounted over it), image (the image's, which must be this version) or checkout (the checkout,
    # always mounted).
    code: str = "auto"
    # pyxis: remap the user to root inside the container (--container-remap-root); off: the user's own uid.
    remap_root: bool = False
    # pyxis and apptainer: mount the user's home (--container-mount-home; apptainer's default, --no-home when off);
    # off by default: ~/.local's packages would shadow the image's (Python adds the user site directory first).
    mount_home: bool = False
    # Set at launch, never typed: the host directories mounted without being listed (the run root, the data and
    # weights paths, the launching directory), kept in config.yaml so that what the ranks start later (an
    # evaluation job) mounts the same. The checkout, when container.code is checkout, is mounted besides.
    auto_mounts: list[str] = field(default_factory=list)
