"""Replica groups on SLURM (parallel.replica_groups with +cluster; docs/faults.md): one job array, task k = group k on
cluster.nodes / N nodes of its own, so that SLURM ends and requeues a group alone; and its lighthouse
(launcher/plan/replica_slurm_plan.py says where; launcher/run/lighthouse_keeper.py keeps it).

A group is ended whole at once when one of its ranks fails: srun's --kill-on-bad-exit kills the step's other ranks,
so that a live rank 0 never holds the quorum. A rank that raises (or whose watchdog fires) requeues its task itself
(train/faults/recovery.py: the failed host left out as for any job); a rank that dies without a word (a signal, the
OOM killer) leaves it to the batch shell, which runs `launcher.worker --group-ended` after srun
(train/replicas/task_end.py). A requeued task heals from a live group (train/replicas/peers.py decides).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.sbatch import executor_parameters, job_python
from contract.rundir import replicas as contract
from launcher.plan.launch_plan import Plan
from launcher.plan.replica_slurm_plan import lighthouse_mode
from launcher.run import rundir, slurm
from launcher.run.lighthouse_keeper import array_file
from launcher.run.replica_groups import group_config

KEEPER_READY_S = 200.0  # its start imports torch (launcher/run/lighthouse.py SLURM_READY_TIMEOUT_S)


def group_parameters(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The array's sbatch parameters: the cluster's, for nodes / N nodes a task; the group's number from the array
    task's; after srun, the batch shell requeues a group whose rank died without a word."""
    groups = int(cfg.parallel.replica_groups)
    params = executor_parameters(cfg)
    params["nodes"] = int(cfg.cluster.nodes) // groups
    params["setup"] = [*params.get("setup", []),
                       f"export {contract.GROUP_ENV}=$SLURM_ARRAY_TASK_ID {contract.GROUPS_ENV}={groups}",
                       f"export {contract.TASK_STARTED_ENV}=$(date +%s)",
                       # torchft's Rust side logs every quorum at info: warnings and errors only, unless asked for
                       'export RUST_LOG="${RUST_LOG:-warn}"']
    ended = (f"{job_python(cfg)} -u -m launcher.worker --group-ended {shlex.quote(str(run_dir))} \"$srun_code\" "
             "|| true")
    # `(exit $srun_code)` hands srun's code on: to a container's teardown (it reads $?) or as the script's own
    params["teardown"] = ["srun_code=$?", f'if [ "$srun_code" != 0 ]; then {ended}; fi', '(exit "$srun_code")',
                          *(params.get("teardown") or [])]
    return params


def lighthouse_script(cfg: DictConfig, run_dir: Path) -> str:
    """The lighthouse's own job: one task, one CPU, for as long as the array lives (lighthouse_keeper)."""
    c = cfg.cluster
    lines = ["#!/bin/bash", f"#SBATCH --job-name={cfg.run.name}-lighthouse", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             "#SBATCH --cpus-per-task=1", f"#SBATCH --time={int(c.time_limit_min)}", "#SBATCH --open-mode=append",
             # --output goes on sbatch's command line (lighthouse_output): a quote in a #SBATCH line is sbatch's to parse
             f"# output: {lighthouse_output(run_dir)}"]
    lines += [f"#SBATCH --{flag}={value}" for flag, value in (("partition", c.partition), ("account", c.account),
                                                             ("qos", c.qos)) if value]
    lines += [f"exec {job_python(cfg)} -u -m launcher.run.lighthouse_keeper {shlex.quote(str(run_dir))}"]
    return "\n".join(lines) + "\n"


def lighthouse_output(run_dir: Path) -> str:
    return f"{slurm.slurm_folder(run_dir)}/lighthouse-%j.out"


def array_script(cfg: DictConfig, plan: Plan, dependency: str | None = None) -> str:
    from submitit.slurm.slurm import _make_sbatch_string

    groups = int(cfg.parallel.replica_groups)
    folder = slurm.slurm_folder(plan.run_dir)
    command = " ".join([job_python(cfg), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, map_count=groups, array_parallelism=groups,
                               dependency=dependency, **group_parameters(cfg, plan.run_dir))


def dry_run(cfg: DictConfig, plan: Plan) -> int:
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    script = array_script(cfg, plan, "after:LIGHTHOUSE_JOB" if lighthouse_mode(cfg) == "job" else None)
    (plan.run_dir / "sbatch.dry_run.sh").write_text(script)
    rundir.write_plan(plan.run_dir, plan)
    print(script)
    if lighthouse_mode(cfg) == "job":
        (plan.run_dir / "lighthouse.dry_run.sh").write_text(lighthouse_script(cfg, plan.run_dir))
        print(lighthouse_script(cfg, plan.run_dir))
    print(f"dry run: nothing submitted; the array's script written to {plan.run_dir / 'sbatch.dry_run.sh'}, the plan "
          f"to {plan.run_dir / 'plan.json'}", file=sys.stderr)
    return 0


def _start_keeper(cfg: DictConfig, run_dir: Path) -> subprocess.Popen[bytes]:
    """parallel.lighthouse=login: the keeper on this host, in a session of its own (it outlives this command)."""
    log = open(run_dir / "logs" / "lighthouse_keeper.log", "ab")  # noqa: SIM115 - the child holds it
    try:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.run.lighthouse_keeper", str(run_dir)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()
    deadline = time.monotonic() + KEEPER_READY_S
    while contract.read_lighthouse(run_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise ConfigError(f"the lighthouse did not start on this host: see {run_dir / 'logs'}/lighthouse.log and "
                              "lighthouse_keeper.log")
        time.sleep(0.1)
    return proc


def _submit_lighthouse_job(cfg: DictConfig, run_dir: Path) -> str:
    slurm.slurm_folder(run_dir).mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["sbatch", "--parsable", f"--output={lighthouse_output(run_dir)}"],
                         input=lighthouse_script(cfg, run_dir), capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ConfigError(f"sbatch refused the lighthouse's job: {' '.join(out.stderr.split())[-400:]}")
    return out.stdout.strip().split(";")[0]


def submit(cfg: DictConfig, plan: Plan, argv: list[str] | None = None) -> int:
    if cfg.launcher.dry_run:
        return dry_run(cfg, plan)
    slurm.preflight(cfg)
    slurm.test_submission(array_script(cfg, plan))
    import submitit

    from launcher.worker import run as train_entry

    groups = int(cfg.parallel.replica_groups)
    config_path = rundir.prepare(cfg, plan.run_dir, argv=argv, plan=plan)
    run_dir = config_path.parent
    configs = [str(group_config(run_dir, g)) for g in range(groups)]
    (run_dir / contract.LIGHTHOUSE_FILE).unlink(missing_ok=True)  # the groups wait for this launch's
    array_file(run_dir).unlink(missing_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    mode, keeper, beacon_job, dependency = lighthouse_mode(cfg), None, None, None
    if mode == "given":
        address = str(cfg.parallel.lighthouse)
        contract.write_lighthouse(run_dir, address, address.rpartition(":")[0], None, "user")
    elif mode == "login":
        keeper = _start_keeper(cfg, run_dir)
    else:
        beacon_job = _submit_lighthouse_job(cfg, run_dir)
        slurm.record_job(run_dir, beacon_job)
        dependency = f"after:{beacon_job}"
    executor = submitit.SlurmExecutor(folder=slurm.slurm_folder(run_dir), max_num_timeout=cfg.cluster.max_requeues,
                                      python=job_python(cfg))
    executor.update_parameters(**group_parameters(cfg, run_dir), array_parallelism=groups)
    if dependency:
        executor.update_parameters(dependency=dependency)
    try:
        jobs = executor.map_array(train_entry, configs)
    except Exception as err:  # submitit wraps sbatch's refusal; SLURM's own words, one line
        if keeper is not None:
            keeper.kill()
        if beacon_job is not None:
            subprocess.run(["scancel", beacon_job], capture_output=True, timeout=60)
        raise ConfigError(f"sbatch refused the replica groups' array: {' '.join(str(err).split())[-400:]}") from err
    array = str(jobs[0].job_id).split("_")[0]
    array_file(run_dir).parent.mkdir(parents=True, exist_ok=True)
    array_file(run_dir).write_text(f"{array}\n")
    slurm.record_job(run_dir, array)
    script = slurm.slurm_folder(run_dir) / f"{jobs[0].job_id}_submission.sh"
    if script.is_file():
        shutil.copyfile(script, run_dir / "sbatch.sh")
    where = (f"job {beacon_job} (its address in {run_dir / contract.LIGHTHOUSE_FILE} once it runs)" if beacon_job
             else contract.read_lighthouse(run_dir)["address"] + (" on this login node" if keeper else ""))  # type: ignore[index]
    print(f"submitted array {array}: {groups} replica groups ({array}_0 .. {array}_{groups - 1})\n"
          f"  lighthouse:    {where}\n"
          f"  run directory: {run_dir}\n"
          f"  group logs:    {slurm.slurm_folder(run_dir)}/{array}_K_R_log.err (group K, rank R)\n"
          f"  follow:        squeue -r -j {array}\n"
          f"  cancel:        scancel {array}" + (f" {beacon_job}" if beacon_job else "") + "\n"
          f"  status:        python -m launcher.status {shlex.quote(str(run_dir))}")
    if cfg.launcher.wait:
        return slurm.follow_tasks([str(job.job_id) for job in jobs])
    return 0
