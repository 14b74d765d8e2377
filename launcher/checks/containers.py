"""container=...: refused before anything is submitted or created unless the image can run this job.

In order: the image is named and, when it is a path, exists; container.code is a choice; every mount parses and
its source exists; container.flags repeats no flag slurmtrain sets; the runtime is installed where the ranks start
(on this node for a local run; for SLURM on this login node, else the probe's one-task srun finds out); the image
starts and holds a usable slurmtrain (launcher/checks/container_probe.py, cached). Then it settles what the job
runs and writes it into the config (container.code: image or checkout; container.auto_mounts) and returns the plan's
lines. Each refusal is one line naming the fix (ConfigError).
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.container.mounts import Mount, automatic, source_checkout
from contract.container.runtimes import PROGRAMS
from contract.container.spec import inside, is_file_image, spec_from_config
from contract.errors import ConfigError
from launcher.checks.container_probe import Found, probe, schema_keys_hash
from launcher.checks.key_checks import path_keys

CODE_CHOICES = ("auto", "image", "checkout")
# The flags each runtime's command line already has (contract/container/runtimes.py), and the key that sets them.
OWN_FLAGS: dict[str, dict[str, str]] = {
    "apptainer": {"--bind": "container.mounts", "-B": "container.mounts", "--env": "container.env",
                  "--pwd": "container.workdir", "--cwd": "container.workdir", "--nv": "the cluster's GPUs",
                  "--no-home": "container.mount_home"},
    "charliecloud": {"-b": "container.mounts", "--bind": "container.mounts", "--set-env": "container.env",
                     "-c": "container.workdir", "--cd": "container.workdir"},
    "podman": {"-v": "container.mounts", "--volume": "container.mounts", "-e": "container.env",
               "--env": "container.env", "-w": "container.workdir", "--workdir": "container.workdir",
               "--rm": "slurmtrain", "--sig-proxy": "slurmtrain", "--network": "slurmtrain (host network)",
               "--net": "slurmtrain (host network)", "--ipc": "slurmtrain (host IPC)",
               "--device": "the cluster's GPUs"},
    "enroot": {"-m": "container.mounts", "--mount": "container.mounts", "-e": "container.env",
               "--env": "container.env"},
    "pyxis": {f"--{name}": key for name, key in (
        ("container-image", "container.image"), ("container-name", "slurmtrain"),
        ("container-mounts", "container.mounts"), ("container-workdir", "container.workdir"),
        ("container-mount-home", "container.mount_home"), ("no-container-mount-home", "container.mount_home"),
        ("container-remap-root", "container.remap_root"), ("no-container-remap-root", "container.remap_root"),
        ("container-env", "container.env"))},
}
FILE_IMAGES = {"enroot": "a .sqsh file (enroot import: docs/containers.md)",
               "charliecloud": "an image directory or SquashFS file (ch-convert: docs/containers.md)"}


def this_version() -> str:
    try:
        return metadata.version("slurmtrain")
    except metadata.PackageNotFoundError:
        return "unknown"


def settle(cfg: DictConfig, run_root: Path, read_paths: list[str] | None = None) -> tuple[str, ...]:
    """Check cfg.container, settle container.code and container.auto_mounts, and return the plan's lines.
    read_paths: what the job reads besides the run root (default: the data and weights paths the config names)."""
    c = cfg.container
    if c.runtime == "none" or inside():  # inside: a search worker's trial, settled by the launch outside
        return ()
    _check_keys(cfg)
    spec = spec_from_config(cfg)
    _check_installed(cfg)
    skip = _probe_skipped(cfg)
    found = None if skip else _probe(cfg)
    code, code_line = _decide_code(cfg, found, skip)
    with open_dict(cfg):
        c.code = code
        c.auto_mounts = automatic(str(run_root), str(c.workdir or os.getcwd()),
                                  _path_values(cfg) if read_paths is None else read_paths)
    spec = spec_from_config(cfg)
    _check_mount_points(spec.runtime, spec.image, [m.dst for m in spec.mounts], list(spec.flags))
    mounts = ", ".join(m.text() for m in spec.mounts)
    lines = [f"container: {c.runtime} {spec.image}; {code_line}",
             f"  mounts (each at its own path unless SRC:DST): {mounts}; working directory {spec.workdir}"]
    if cfg.get("cluster") is not None and (cfg.get("eval") or {}).get("async_jobs"):
        lines.append("  eval.async_jobs: rank 0 submits the evaluation jobs with sbatch from inside the image, which "
                     "needs the cluster's SLURM client there (docs/containers.md)")
    return tuple(lines)


def _check_keys(cfg: DictConfig) -> None:
    c, rt = cfg.container, cfg.container.runtime
    if not c.image:
        raise ConfigError(f"container={rt} needs the image: set container.image= (a registry reference, a .sqsh or "
                          ".sif file, or an image directory: docs/containers.md)")
    image = os.path.expanduser(str(c.image))
    if (is_file_image(image) or rt in FILE_IMAGES) and not os.path.exists(image):
        kind = FILE_IMAGES.get(rt, "an image file")
        raise ConfigError(f"container.image={c.image} does not exist: give {kind} that exists, or build one "
                          "(docs/containers.md)")
    if c.code not in CODE_CHOICES:
        raise ConfigError(f"container.code={c.code} is not one of {', '.join(CODE_CHOICES)}")
    for text in c.mounts:
        try:
            mount = Mount.parse(str(text))
        except ValueError as err:
            raise ConfigError(f"{err}: write each as SRC:DST or SRC:DST:ro") from None
        if not os.path.exists(mount.src):
            raise ConfigError(f"container.mounts entry {text}: {mount.src} does not exist on this machine: create "
                              "it, fix the path, or drop the mount")
        if rt == "charliecloud" and mount.read_only:
            raise ConfigError(f"container.mounts entry {text}: Charliecloud 0.31's ch-run -b binds read-write only: "
                              "drop :ro")
    for flag in c.flags:
        name = str(flag).split("=", 1)[0]
        key = OWN_FLAGS[rt].get(name)
        if key is not None:
            fix = "drop it" if key.startswith(("slurmtrain", "the cluster")) else f"set {key} instead"
            raise ConfigError(f"container.flags has {flag}, a flag slurmtrain sets itself for container={rt} "
                              f"(from {key}): {fix}")


def _check_installed(cfg: DictConfig) -> None:
    rt = cfg.container.runtime
    program = PROGRAMS[rt]
    if cfg.get("cluster") is None and shutil.which(program) is None:
        raise ConfigError(f"container={rt} needs {program}, which is not installed on this machine: install "
                          f"{'Charliecloud' if rt == 'charliecloud' else rt} (docs/containers.md), or choose "
                          "another container= (none runs without one)")
    if rt == "pyxis" and not cfg.launcher.dry_run:
        if shutil.which("srun") is None:
            raise ConfigError("container=pyxis runs through srun, and there is no SLURM client here: run on a login "
                              "node, or add launcher.dry_run=true")
        import subprocess

        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=60)
        if "--container-image" not in out.stdout:
            raise ConfigError("container=pyxis needs NVIDIA's pyxis plugin in srun, and `srun --help` here has no "
                              "--container-image: ask the cluster's admins, or choose container=enroot")


def _probe_skipped(cfg: DictConfig) -> str:
    """Why the image is not started now ("" when it is): a dry run where only a SLURM job could start it, and
    inside a batch script (launcher.prepare_only)."""
    if cfg.launcher.prepare_only:
        return "settled by the command that submitted this job"
    remote = cfg.get("cluster") is not None and (cfg.container.runtime == "pyxis"
                                                 or shutil.which(PROGRAMS[cfg.container.runtime]) is None)
    if cfg.launcher.dry_run and remote:
        return "not started in a dry run (only a SLURM job can start it)"
    return ""


def _probe(cfg: DictConfig) -> Found:
    """The image as it is: its own slurmtrain, without the automatic mounts and the checkout."""
    bare = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    with open_dict(bare):
        bare.container.code, bare.container.auto_mounts, bare.container.workdir = "image", [], "/"
    spec = spec_from_config(bare)
    found = probe(spec, cfg.get("cluster"))
    if not found.version:
        raise ConfigError(f"container={spec.runtime} could not start {spec.image} on {found.where}: {found.error} "
                          "(fix the image or the runtime, then run again)")
    if found.torch == "missing":
        raise ConfigError(f"{spec.image} has no torch for {spec.python}: use an image with PyTorch (docker/Dockerfile "
                          "builds one), or point container.python at the interpreter that has it")
    return found


def _decide_code(cfg: DictConfig, found: Found | None, skipped: str) -> tuple[str, str]:
    """container.code as image or checkout, and the plan's words for which slurmtrain the ranks run."""
    c, ours, checkout = cfg.container, this_version(), source_checkout()
    if found is None:
        code = "checkout" if c.code == "checkout" or (c.code == "auto" and checkout is not None) else "image"
        which = f"this checkout's code, {checkout}, mounted" if code == "checkout" else "the image's slurmtrain"
        return code, f"runs {which} (the image not checked: {skipped})"
    theirs = found.version
    where = f"checked on {found.where}" + (", cached" if found.cached else "")
    detail = f"python {found.python}, torch {found.torch}; {where}"
    usable = not theirs.startswith("broken")
    same = usable and theirs == ours and found.keys == schema_keys_hash()
    what = theirs if not usable or theirs != ours else f"{theirs} with another config schema (other keys)"
    if c.code == "image" or (c.code == "auto" and same):
        if not same:
            fix = ("run with container.code=checkout (this launcher is a source checkout)" if checkout is not None
                   else "install this version in the image (docs/containers.md)")
            raise ConfigError(f"slurmtrain inside {c.image} is {what}, this launcher is {ours}: rebuild the image "
                              f"from this slurmtrain, or {fix}")
        return "image", f"runs the image's slurmtrain {theirs} ({detail})"
    if checkout is None:
        raise ConfigError(f"slurmtrain inside {c.image} is {what}, this launcher is {ours} and not a source "
                          "checkout to mount over it: rebuild the image from this slurmtrain (docs/containers.md), "
                          "or install slurmtrain from a checkout (pip install -e)")
    why = "the same checkout" if c.code == "checkout" else f"the image's is {what}"
    return "checkout", f"runs this checkout's code, {checkout}, mounted over the image's ({why}; {detail})"


def _path_values(cfg: DictConfig) -> list[str]:
    out: list[str] = []
    for key, inner in path_keys():
        node: Any = OmegaConf.select(cfg, key, default=None)
        if node is None:
            continue
        values = node.values() if inner and hasattr(node, "values") else [node]
        for v in values:
            value = v.get(inner) if inner and hasattr(v, "get") else v
            if isinstance(value, str) and value and os.path.isabs(value) and key != "run.root":
                out.append(value)
    return out


def _check_mount_points(runtime: str, image: str, dsts: list[str], flags: list[str]) -> None:
    """ch-run binds only onto directories the image has (and 0.31 cannot add them to a read-only image): /tmp is
    the host's already (without --private-tmp), anything else must exist in an image directory."""
    if runtime != "charliecloud" or not os.path.isdir(image):
        return
    private_tmp = any(f in ("-t", "--private-tmp") for f in flags)
    for dst in dsts:
        if not private_tmp and (dst == "/tmp" or dst.startswith("/tmp/")):
            continue
        if not os.path.isdir(os.path.join(image, dst.lstrip("/"))):
            raise ConfigError(f"container=charliecloud mounts {dst}, which the image {image} lacks (ch-run binds "
                              f"only onto existing directories): mkdir -p {os.path.join(image, dst.lstrip('/'))}, "
                              "or keep the run, data and project under /tmp or a directory the image has")
