"""`python -m launcher.prepare ... +cluster=NAME container=RUNTIME container.KEY=VALUE`: the array and the finalize
job start in the training job's image, through the same runtime and the same command lines as training's ranks
(contract/container/job.py), after the same checks (launcher/checks/containers.py: the image, the mounts, the
flags, the runtime, slurmtrain inside the image, cached). What the jobs read and write is mounted without being
listed, each at its own path: the output directory, the input files' directories, the tokenizer's and the
directory the command runs in; container.mounts adds more.

Without +cluster a preparation runs in this Python, the one that checked and planned it (the login side, which
needs no image and no torch), so container= without +cluster is refused rather than ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.container import job as container_job
from contract.errors import ConfigError
from launcher.prepare.plan import PARTS, Plan

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class Request:
    """container=RUNTIME and its container.KEY=VALUE overrides, as typed (runtime None: keys without the group,
    which refuse_local and job_config refuse)."""

    runtime: str | None
    overrides: tuple[str, ...] = ()


def split_overrides(argv: list[str]) -> tuple[list[str], str | None, list[str], Request | None]:
    """`+cluster=NAME`, `cluster.KEY=VALUE`, `container=RUNTIME` and `[+]container.KEY=VALUE` (as for training) are
    not argparse options: take them out first. Returns the rest, the cluster, its overrides and the container."""
    rest, cluster, overrides, runtime, container = [], None, [], None, []
    for arg in argv:
        if arg.startswith(("+cluster=", "cluster=")):
            cluster = arg.split("=", 1)[1]
        elif arg.startswith("cluster.") and "=" in arg:
            overrides.append(arg)
        elif arg.startswith(("+container=", "container=")):
            runtime = arg.split("=", 1)[1]
        elif arg.lstrip("+").startswith("container.") and "=" in arg:
            container.append(arg.lstrip("+"))
        else:
            rest.append(arg)
    given = runtime is not None or container
    return rest, cluster, overrides, (Request(runtime, tuple(container)) if given else None)


def _check_runtime_named(request: Request) -> None:
    if request.runtime is None:
        raise ConfigError(f"{request.overrides[0]} needs container=RUNTIME (the training job's: pyxis, enroot, "
                          "apptainer, charliecloud or podman)")


def refuse_local(request: Request | None) -> None:
    if request is not None:
        _check_runtime_named(request)
    if request is not None and request.runtime != "none":
        raise ConfigError(f"container={request.runtime} runs a preparation's SLURM jobs in the image: add "
                          "+cluster=NAME, or drop container= to prepare here (a local preparation runs in this "
                          "Python, which planned it)")


def load_container(request: Request, config_dir: str | None = None) -> Any:
    """conf/container/RUNTIME.yaml (a --config-dir first) merged onto the schema's ContainerConfig, then the
    overrides: the same group and keys as training's."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from contract.config.container import ContainerConfig

    dirs = ([Path(config_dir).expanduser() / "container"] if config_dir else []) + [CONF / "container"]
    path = next((d / f"{request.runtime}.yaml" for d in dirs if (d / f"{request.runtime}.yaml").is_file()), None)
    if path is None:
        known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
        raise ConfigError(f"no container runtime named {request.runtime!r}: choose container= one of "
                          f"{', '.join(known)}")
    try:
        return OmegaConf.merge(OmegaConf.structured(ContainerConfig), OmegaConf.load(path),
                               OmegaConf.from_dotlist([o.removeprefix("container.") for o in request.overrides]))
    except OmegaConfBaseException as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"container={request.runtime}: {reason}: fix that key (see contract/config/container.py)"
                          ) from None


def job_config(request: Request | None, cluster: Any, out: Path, read: list[str],
               config_dir: str | None = None) -> tuple[Any, tuple[str, ...]]:
    """The config the preparation's job scripts render their container from (None: no container), checked and
    settled as a training launch's is, with OUT and READ (paths the jobs read) mounted, and the plan's container
    lines. Raises ConfigError before anything is written or queued."""
    if request is None:
        return None, ()
    _check_runtime_named(request)
    if request.runtime == "none":
        return None, ()
    from omegaconf import OmegaConf, open_dict

    from launcher.checks.containers import settle

    cfg = OmegaConf.create({"container": load_container(request, config_dir), "cluster": cluster,
                            "launcher": {"dry_run": False, "prepare_only": False},
                            # a rank's requeue request (contract/container/requeue.py) goes under .parts/
                            "run": {"root": str(out / PARTS)}})
    with open_dict(cfg):
        cfg.cluster.gpus_per_node = 0  # a CPU job: no --nv, no CDI device
    return cfg, settle(cfg, out, read)


def read_paths(plan: Plan) -> list[str]:
    """What the jobs read besides the output directory: every input file and the tokenizer's file."""
    paths = [f.path for f in plan.inputs]
    if plan.tokenizer.info.path:
        paths.append(os.path.abspath(plan.tokenizer.info.path))
    return paths


def with_container(params: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """A job's submitit parameters with the container's srun flags (pyxis), setup and teardown lines."""
    if cfg is None:
        return params
    teardown = container_job.teardown_lines(cfg)
    return {**params, "setup": [*params.get("setup", []), *container_job.setup_lines(cfg)],
            "srun_args": [*params.get("srun_args", []), *container_job.srun_args(cfg)],
            **({"teardown": teardown} if teardown else {})}


def job_python(cfg: Any) -> str | None:
    """submitit's `python`, what starts Python on the jobs' srun task: the image's through its runtime (None: this
    interpreter)."""
    return None if cfg is None else container_job.job_python(cfg)
