"""`python -m launcher.prepare ... +cluster=NAME`: the preparation as one SLURM CPU job array and a finalize job.

The cluster is conf/cluster/NAME.yaml (or DIR/cluster/NAME.yaml with --config-dir DIR), checked against the same
schema as training's, with `cluster.KEY=VALUE` overrides (e.g. `cluster.partition=cpu`: a preparation needs no
GPU). The plan is checked and written here, exactly as for a local preparation; then each array element runs
pending tasks (one task per element unless there are more tasks than the cluster's MaxArraySize allows) with the
cluster's cpus_per_task for the tokenizer's threads, and a finalize job, started after the array, writes
manifest.json. The output is byte-identical to a local preparation's. The command returns once both are queued;
running it again after a failed task resubmits only the missing tasks. With container=RUNTIME both jobs start in the
training job's image (launcher/prepare/container.py).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from contract.data.manifest import MANIFEST
from contract.errors import ConfigError
from launcher.prepare import container as image_jobs
from launcher.prepare.jobs import JOBS
from launcher.prepare.plan import PLAN, Plan, load_plan

CONF = Path(__file__).resolve().parents[2] / "conf"


def load_cluster(name: str, overrides: list[str], config_dir: str | None = None) -> Any:
    """conf/cluster/NAME.yaml (a --config-dir first) merged onto the schema's ClusterConfig, then overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from contract.config.schema import ClusterConfig

    dirs = ([Path(config_dir).expanduser() / "cluster"] if config_dir else []) + [CONF / "cluster"]
    path = next((d / f"{name}.yaml" for d in dirs if (d / f"{name}.yaml").is_file()), None)
    if path is None:
        known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
        raise ConfigError(
            f"no cluster named {name!r} (in {', '.join(map(str, dirs))}): use one of "
            f"{', '.join(known)}, or add --config-dir DIR holding cluster/{name}.yaml"
        )
    try:
        cluster = OmegaConf.merge(
            OmegaConf.structured(ClusterConfig),
            OmegaConf.load(path),
            OmegaConf.from_dotlist([o.removeprefix("cluster.") for o in overrides]),
        )
    except OmegaConfBaseException as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"cluster {name} ({path}): {reason}: fix that key (see ClusterConfig in contract/config/schema.py)"
        ) from None
    return cluster


def executor_parameters(cluster: Any, job_name: str) -> dict[str, Any]:
    """One CPU task per array element, no GPUs: what a preparation needs of the cluster's settings."""
    setup = [f"export {k}={shlex.quote(str(v))}" for k, v in cluster.env.items()] + list(cluster.setup)
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": cluster.cpus_per_task,
        "time": cluster.time_limit_min,
        "partition": cluster.partition,
        "account": cluster.account,
        "qos": cluster.qos,
        "constraint": cluster.constraint,
        "stderr_to_stdout": True,
        "setup": setup,
        "additional_parameters": dict(cluster.extra_sbatch),
    }
    if cluster.mem_per_task_gb:
        params["mem"] = f"{int(cluster.mem_per_task_gb * 1024)}MB"
    return {k: v for k, v in params.items() if v is not None}


def check_first(cluster_name: str | None, overrides: list[str], config_dir: str | None,
                container: image_jobs.Request | None, out: Path) -> None:
    """Before anything is read, trained or written: the cluster's keys, and the container's image, runtime and
    slurmtrain inside it (the image's answer is cached: submit's check, with the inputs' mounts, starts nothing)."""
    if cluster_name is None:
        image_jobs.refuse_local(container)
        if overrides:
            raise ConfigError(f"{overrides[0]} needs +cluster=NAME (without it the preparation runs here)")
        return
    image_jobs.job_config(container, load_cluster(cluster_name, overrides, config_dir), out, [], config_dir)


def max_array_size() -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return max(1, int(value) - 1)  # indices run 0 .. MaxArraySize-1
    return 1000


def _groups(pending: list[int], elements: int) -> list[list[int]]:
    return [pending[k::elements] for k in range(elements)]


def submit(plan: Plan, cluster_name: str, overrides: list[str], config_dir: str | None, overwrite: bool,
           container: image_jobs.Request | None = None) -> str:
    """Queue the array and the finalize job (in container's image, when given); returns what to print. Nothing is
    written or queued when a check fails."""
    from omegaconf import OmegaConf

    from launcher.prepare.run import claimed, finalize, pending_tasks
    from launcher.run import slurm

    cluster = load_cluster(cluster_name, overrides, config_dir)
    slurm.preflight(OmegaConf.create({"cluster": cluster}))
    in_image, lines = image_jobs.job_config(container, cluster, Path(plan.out), image_jobs.read_paths(plan),
                                            config_dir)
    with claimed(plan, overwrite):
        pending = pending_tasks(plan)
        if not pending:
            finalize(plan)
            return f"already prepared: {plan.out} (every task complete; manifest.json written)"
        (Path(plan.out) / MANIFEST).unlink(missing_ok=True)
        return "".join(f"{line}\n" for line in lines) + _queue(plan, cluster, pending, in_image)


def _queue(plan: Plan, cluster: Any, pending: list[int], in_image: Any) -> str:
    import submitit

    folder = plan.parts / "slurm"
    name = f"prepare-{Path(plan.out).name}"
    groups = _groups(pending, min(len(pending), max_array_size()))
    plan_path = str(plan.parts / PLAN)
    python = image_jobs.job_python(in_image)
    array = submitit.SlurmExecutor(folder=folder, max_num_timeout=cluster.max_requeues, python=python)
    array.update_parameters(**image_jobs.with_container(executor_parameters(cluster, name), in_image),
                            array_parallelism=cluster.array_parallelism)
    finisher = submitit.SlurmExecutor(folder=folder, max_num_timeout=cluster.max_requeues, python=python)
    params = image_jobs.with_container(executor_parameters(cluster, f"{name}-finalize"), in_image)
    try:
        jobs = array.map_array(run_array_element, [plan_path] * len(groups), groups)
        array_id = str(jobs[0].job_id).split("_")[0]
        # afterany: a failed task must not leave the finalize job pending forever; it reports what is missing.
        params["additional_parameters"] = {
            **params["additional_parameters"],
            "dependency": f"afterany:{array_id}",
        }
        finisher.update_parameters(**params)
        final = finisher.submit(run_finalize, plan.out)
    except Exception as err:  # submitit wraps sbatch's refusal: SLURM's own words, one line
        raise ConfigError(
            f"sbatch refused the preparation: {' '.join(str(err).split())[-400:]}; fix the cluster.* settings"
        ) from None
    with open(plan.parts / JOBS, "a") as fh:
        fh.write(f"{array_id}\n{final.job_id}\n")
    at_once = min(len(groups), cluster.array_parallelism)
    return (
        f"submitted the preparation of {plan.out}: array {array_id} ({len(groups)} task{'s' if len(groups) > 1 else ''}, at most {at_once} "
        f"at once, {cluster.cpus_per_task} CPU{'s' if cluster.cpus_per_task > 1 else ''} each) and finalize job {final.job_id} after it\n"
        f"  follow:  squeue -j {array_id},{final.job_id}; logs in {shlex.quote(str(folder))}\n"
        f"  status:  python -m launcher.status {shlex.quote(str(plan.out))}\n"
        f"  done:    when {shlex.quote(str(Path(plan.out) / MANIFEST))} exists; after a failed task, run the same "
        f"command again: only the missing tasks are submitted\n"
        f"  cancel:  scancel {array_id} {final.job_id}"
    )


# ---------------------------------------------------------------- on the compute nodes


def run_array_element(plan_path: str, indices: list[int]) -> int:
    """Run these tasks of the plan (those a requeued element has not finished yet); returns how many ran."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:  # before the tokenizer's thread pool starts
        os.environ.setdefault("RAYON_NUM_THREADS", cpus)
    import numpy as np

    from launcher.prepare.shards import completed_record, run_task
    from launcher.prepare.tokenizer import encoder_for

    plan = load_plan(Path(plan_path).parent.parent)
    assert plan is not None, f"{plan_path} is missing"
    encoder = encoder_for(plan.tokenizer)
    itemsize = np.dtype(plan.tokenizer.dtype).itemsize
    ran = 0
    for index in indices:
        if completed_record(plan, index, itemsize) is None:
            run_task(plan, index, encoder)
            ran += 1
    return ran


def run_finalize(out: str) -> str:
    from launcher.prepare.run import finalize, pending_tasks, skipped_line

    plan = load_plan(Path(out))
    assert plan is not None, f"{out} holds no plan"
    missing = pending_tasks(plan)
    if missing:
        raise RuntimeError(
            f"{len(missing)} tasks of {out} did not complete (first: task {missing[0]}; logs in "
            f"{plan.parts / 'slurm'}): run the same command again to resubmit them"
        )
    manifest = finalize(plan)
    skipped = skipped_line(manifest)
    return (
        f"prepared {out}: {manifest.split('train').tokens:,} train tokens, fingerprint {manifest.fingerprint}"
        + (f"\n{skipped}" if skipped else "")
    )
