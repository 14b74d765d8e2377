"""Each runtime's command line around the interpreter inside the image: the argv up to and including
container.python, to which `-m launcher.worker ...` (or submitit's `-u -m submitit.core._submit ...`) is appended.

    apptainer     apptainer exec [--nv] --no-home --bind SRC:DST[:ro] --env K=V --pwd DIR IMAGE python
    charliecloud  ch-run --unset-env=PYTHONPATH ... -b SRC:DST --set-env=K=V --cd=DIR IMAGE -- python
                  (the host environment passes, less what would point at the host's Python; /tmp is the host's,
                  so nothing below it is bound again)
    podman        podman run --rm --sig-proxy=true --network=host --ipc=host -v SRC:DST[:ro] -e 'SLURM_*' ... -e K=V
                  -w DIR [--device nvidia.com/gpu=all] IMAGE python     (the signals forwarded to the rank, PID 1)
    enroot        bash -c 'exec enroot start $(-e for each passed name set here) "$@"' enroot
                  --mount SRC:DST:none:x-create=auto,rbind -e K=V NAME env --chdir=DIR python
                  (enroot starts from a clean environment and has no working-directory flag; NAME is made once
                  per node by `enroot create`: contract/container/job.py)
    pyxis         no wrapper: srun's own --container-* flags (pyxis_srun_args) and python

Every path is mounted at its own path (contract/container/mounts.py). Torch-free.
"""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Callable

from contract.container.spec import PASSED_ENV, Spec

CONTAINERS_CONF = ("/etc/containers/containers.conf", "/usr/share/containers/containers.conf")
# podman's defaults that fail without CAP_SYS_RESOURCE (its default ulimits) or where cgroups are in hybrid mode
# (crun): used only where no containers.conf sets them (podman_site_flags).
PODMAN_ULIMITS = ("--ulimit=nofile=20000:20000", "--ulimit=nproc=32768:32768")


def apptainer(spec: Spec) -> list[str]:
    argv = ["apptainer", "exec", *(["--nv"] if spec.gpus else []), *([] if spec.mount_home else ["--no-home"])]
    for m in spec.mounts:
        argv += ["--bind", m.text()]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, "--pwd", spec.workdir, *spec.flags, spec.image, spec.python]


# ch-run passes the host's whole environment in: these would point the image's Python at the host's packages.
HOST_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD")


def charliecloud(spec: Spec) -> list[str]:
    argv = ["ch-run", *(f"--unset-env={name}" for name in HOST_ONLY_ENV)]
    if not os.environ.get("USER"):  # ch-run refuses to start without it (a cron job's or a bare test's environment)
        argv = ["env", f"USER={getpass.getuser()}", *argv]
    shared_tmp = not any(f in ("-t", "--private-tmp") for f in spec.flags)
    for m in spec.mounts:
        if shared_tmp and m.src == m.dst and (m.dst + "/").startswith("/tmp/"):
            continue  # ch-run shares the host's /tmp already
        argv += ["-b", f"{m.src}:{m.dst}"]
    argv += [f"--set-env={key}={value}" for key, value in spec.env.items()]
    return [*argv, f"--cd={spec.workdir}", *spec.flags, spec.image, "--", spec.python]


def _containers_conf_sets(word: str) -> bool:
    paths = [os.environ.get("CONTAINERS_CONF", ""), *CONTAINERS_CONF,
             os.path.expanduser("~/.config/containers/containers.conf")]
    for path in paths:
        try:
            with open(path) as f:
                if any(line.split("=")[0].strip() == word for line in f if not line.lstrip().startswith("#")):
                    return True
        except OSError:
            continue
    return False


def podman_site_flags() -> list[str]:
    """runc and ulimits a process without CAP_SYS_RESOURCE can set, unless a containers.conf chooses."""
    flags = []
    if not _containers_conf_sets("runtime"):
        flags.append("--runtime=runc")
    if not _containers_conf_sets("default_ulimits"):
        flags += PODMAN_ULIMITS
    return flags


def podman(spec: Spec) -> list[str]:
    # No --init: the rank is the container's PID 1, and its own SIGUSR1/SIGTERM handlers take what podman's
    # --sig-proxy forwards (a PID 1 ignores only the signals it has no handler for); catatonit, which --init needs,
    # is not everywhere.
    argv = ["podman", "run", "--rm", "--sig-proxy=true", "--network=host", "--ipc=host", *podman_site_flags()]
    for m in spec.mounts:
        argv += ["-v", m.text()]
    # A name alone takes the host's value where the host has one; NAME* every host variable so prefixed.
    argv += [x for name in PASSED_ENV for x in ("-e", f"{name}*" if name.endswith("_") else name)]
    for key, value in spec.env.items():
        argv += ["-e", f"{key}={value}"]
    argv += ["-w", spec.workdir, *(["--device", "nvidia.com/gpu=all"] if spec.gpus else [])]
    return [*argv, *spec.flags, spec.image, spec.python]


def _enroot_env_script() -> str:
    patterns = "|".join(f"{name}*" if name.endswith("_") else name for name in PASSED_ENV)
    return ('exec enroot start $(for v in $(compgen -e); do case $v in ' + patterns
            + ') printf -- "-e %s " "$v";; esac; done) "$@"')


def enroot(spec: Spec) -> list[str]:
    argv = ["bash", "-c", _enroot_env_script(), "enroot"]
    for m in spec.mounts:
        argv += ["--mount", f"{m.src}:{m.dst}:none:x-create=auto,rbind" + (",ro" if m.read_only else "")]
    for key, value in spec.env.items():
        argv += ["-e", f"{key}={value}"]
    return [*argv, *spec.flags, spec.name, "env", f"--chdir={spec.workdir}", spec.python]


def pyxis(spec: Spec) -> list[str]:
    """Under srun with pyxis_srun_args the task already runs in the image: the interpreter alone."""
    return [spec.python]


def pyxis_srun_args(spec: Spec) -> list[str]:
    """srun's pyxis flags: the image unpacked once per node under a name its ranks (and a requeued attempt, where
    pyxis keeps named containers) share, the mounts, the working directory, no home (~/.local's packages would
    shadow the image's), the user's own uid unless container.remap_root."""
    args = [f"--container-image={spec.image}", f"--container-name={spec.name}"]
    if spec.mounts:
        args.append("--container-mounts=" + ",".join(m.text() for m in spec.mounts))
    args += [f"--container-workdir={spec.workdir}",
             "--container-mount-home" if spec.mount_home else "--no-container-mount-home",
             "--container-remap-root" if spec.remap_root else "--no-container-remap-root"]
    if spec.env:
        # pyxis starts from the job's environment (the setup lines export these) and the image's; the named ones
        # take the job's value over the image's.
        args.append("--container-env=" + ",".join(spec.env))
    return [*args, *spec.flags]


WRAPPERS: dict[str, Callable[[Spec], list[str]]] = {
    "apptainer": apptainer, "charliecloud": charliecloud, "podman": podman, "enroot": enroot, "pyxis": pyxis,
}
# The program each runtime needs where the ranks start (pyxis: srun's plugin, found by `srun --help`).
PROGRAMS = {"apptainer": "apptainer", "charliecloud": "ch-run", "podman": "podman", "enroot": "enroot",
            "pyxis": "srun"}


def wrap(spec: Spec) -> list[str]:
    """The argv that starts spec.python inside the image."""
    return WRAPPERS[spec.runtime](spec)


def shell(argv: list[str]) -> str:
    return shlex.join(argv)
