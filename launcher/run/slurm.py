"""Cluster config -> submitit executor parameters; sbatch rendering for dry runs; submission and following.

One srun task per GPU (or per `tasks_per_node` on CPU clusters), no torchrun: under `srun torchrun` the agent
would be killed by the preemption signal before the ranks could checkpoint.
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
from contract.rules.eval_job_script import render_script
from contract.rules.eval_jobs import jobs_enabled
from contract.rules.sbatch import executor_parameters, job_python
from launcher.plan.launch_plan import Plan
from launcher.run import rundir
from launcher.run.remote.hints import follow_command, login_node_note

TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED")
POLL_S = 2.0


def slurm_folder(run_dir: Path) -> Path:
    return run_dir / "slurm"


def render_sbatch(cfg: DictConfig, plan: Plan, folder: Path | None = None, job_name: str | None = None,
                  array_size: int | None = None) -> str:
    """The exact script submitit submits, rendered without a cluster (dry runs, login nodes without srun); a sweep
    passes its own folder, job name and array size."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = folder or slurm_folder(plan.run_dir)
    command = " ".join([job_python(cfg), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    params = executor_parameters(cfg)
    if job_name:
        params["job_name"] = job_name
    if array_size and array_size > 1:
        params.update(map_count=array_size, array_parallelism=cfg.cluster.array_parallelism)
    return _make_sbatch_string(command=command, folder=folder, **params)


def preflight(cfg: DictConfig) -> None:
    """Checks against the live cluster, before anything is written or queued."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        raise ConfigError("no SLURM client here (sbatch not found): run on a login node, drop +cluster to run "
                          "locally, or add launcher.dry_run=true")
    part = cfg.cluster.partition
    if part:
        out = subprocess.run(["scontrol", "show", "partition", part], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            names = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=60)
            valid = ", ".join(sorted(set(names.stdout.split()))) or "none found"
            raise ConfigError(f"partition '{part}' does not exist on this cluster: set cluster.partition to one "
                              f"of {valid}")


def live_jobs(run_dir: Path) -> list[str]:
    """The jobs of RUN_DIR/jobs.txt that SLURM still has queued or running."""
    jobs_file = run_dir / "jobs.txt"
    if not jobs_file.is_file() or shutil.which("squeue") is None:
        return []
    ids = jobs_file.read_text().split()
    out = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(ids)], capture_output=True, text=True,
                         timeout=60)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def refuse_live_jobs(run_dir: Path) -> None:
    """Two jobs training one run directory would overwrite each other's checkpoints."""
    live = live_jobs(run_dir)
    if live:
        raise ConfigError(f"job {live[0]} is still queued or running on {run_dir}: wait for it, `scancel {live[0]}`, "
                          "or pick another run.name")


def record_job(run_dir: Path, job_id: str) -> None:
    with (run_dir / "jobs.txt").open("a") as f:
        f.write(f"{job_id}\n")


def test_submission(script: str) -> None:
    """sbatch --test-only: SLURM's own verdict on account, qos, constraint, GPUs, without queueing anything."""
    out = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        message = " ".join(out.stderr.replace("sbatch: error:", "").split())
        raise ConfigError(f"SLURM would refuse this job: {message[-400:]}; fix the cluster.* settings")


def submit(cfg: DictConfig, plan: Plan, argv: list[str] | None = None) -> int:
    if cfg.launcher.dry_run:
        return dry_run(cfg, plan)
    preflight(cfg)
    test_submission(render_sbatch(cfg, plan))
    import submitit

    from launcher.worker import run as train_entry

    config_path = rundir.prepare(cfg, plan.run_dir, argv=argv, plan=plan)
    executor = submitit.SlurmExecutor(folder=slurm_folder(plan.run_dir), max_num_timeout=cfg.cluster.max_requeues,
                                      python=job_python(cfg))
    executor.update_parameters(**executor_parameters(cfg))
    try:
        job = executor.submit(train_entry, str(config_path))
    except Exception as err:  # submitit wraps sbatch's refusal; show SLURM's own words, one line
        message = " ".join(str(err).split())
        raise ConfigError(f"sbatch refused the job: {message[-400:]}") from err
    script = slurm_folder(plan.run_dir) / f"{job.job_id}_submission.sh"
    if script.is_file():
        shutil.copyfile(script, plan.run_dir / "sbatch.sh")
    record_job(plan.run_dir, str(job.job_id))
    # Ranks log to stderr; submitit keeps one file per task (rank).
    log_out = job.paths.stderr
    print(f"submitted job {job.job_id}\n"
          f"  run directory: {plan.run_dir}\n"
          f"  rank 0 log:    {log_out} (rank N: {_q(str(log_out).replace('_0_log', '_N_log'))})\n"
          f"  follow:        squeue -j {job.job_id}; tail -f {_q(log_out)}\n"
          f"  cancel:        scancel {job.job_id}\n"
          f"  accounting:    sacct -j {job.job_id} -D\n"
          f"  status:        {follow_command('launcher.status', plan.run_dir)}\n{login_node_note()}", end="")
    if cfg.launcher.wait:
        return follow(str(job.job_id), Path(log_out))
    return 0


def _q(path: Any) -> str:
    return shlex.quote(str(path))


def dry_run(cfg: DictConfig, plan: Plan) -> int:
    # Only the script: config.yaml is the contract a live job re-reads on requeue, and a dry run changes nothing.
    script = render_sbatch(cfg, plan)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    path = plan.run_dir / "sbatch.dry_run.sh"
    path.write_text(script)
    rundir.write_plan(plan.run_dir, plan)
    print(script)
    print(f"dry run: nothing submitted; script written to {path}, the plan to {plan.run_dir / 'plan.json'}",
          file=sys.stderr)
    return 0


def job_state(job_id: str) -> tuple[str, str]:
    """(state, exit code) of the job's allocation as accounting sees it; ("", "") before it is recorded."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
                         capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        return "", ""
    state, _, code = lines[-1].partition("|")
    return state.split()[0], code


def in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=60)
    return bool(out.stdout.strip())


# Polls in a row with neither an accounting record nor a queue entry before giving up (sacct can lag a little).
UNKNOWN_POLLS = 30


def follow(job_id: str, log_path: Path) -> int:
    """Stream the rank-0 log until the job ends; exit 0 only if SLURM says COMPLETED. Ctrl-C stops following."""
    try:
        return _follow(job_id, log_path)
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job_id} keeps running: squeue -j {job_id}; cancel with scancel {job_id}",
              file=sys.stderr)
        return 130


def _follow(job_id: str, log_path: Path) -> int:
    offset, unknown = 0, 0
    while True:
        offset = _print_new(log_path, offset)
        state, code = job_state(job_id)
        if state.startswith(TERMINAL_STATES):
            _print_new(log_path, offset)
            print(f"job {job_id} ended: {state} (exit code {code})", file=sys.stderr)
            return 0 if state == "COMPLETED" else 1
        unknown = unknown + 1 if not state and not in_queue(job_id) else 0
        if unknown >= UNKNOWN_POLLS:
            print(f"job {job_id} left the queue and accounting has no record of it (is slurmdbd running?): "
                  f"see {log_path}", file=sys.stderr)
            return 1
        time.sleep(POLL_S)


def follow_tasks(job_ids: list[str], status_command: str = "") -> int:
    """Wait until every job (array task) has ended, printing each state change; 0 only if all COMPLETED.
    Ctrl-C stops following, not the jobs."""
    try:
        return _follow_tasks(job_ids)
    except KeyboardInterrupt:
        print(f"\nstopped following; the jobs keep running ({', '.join(job_ids)})"
              + (f": {status_command}" if status_command else "") + f"; cancel with scancel {' '.join(job_ids)}",
              file=sys.stderr)
        return 130


def _follow_tasks(job_ids: list[str]) -> int:
    seen: dict[str, str] = {}
    unknown = dict.fromkeys(job_ids, 0)
    while True:
        for job_id in job_ids:
            if seen.get(job_id, "").startswith(TERMINAL_STATES):
                continue
            state, code = job_state(job_id)
            if not state:
                unknown[job_id] = 0 if in_queue(job_id) else unknown[job_id] + 1
                state = "LOST" if unknown[job_id] >= UNKNOWN_POLLS else "PENDING"
            if state != seen.get(job_id):
                print(f"job {job_id}: {state}" + (f" (exit code {code})" if state.startswith(TERMINAL_STATES) else ""),
                      file=sys.stderr)
                seen[job_id] = state
        if all(seen[j].startswith(TERMINAL_STATES) or seen[j] == "LOST" for j in job_ids):
            failed = [j for j in job_ids if seen[j] != "COMPLETED"]
            print(f"{len(job_ids) - len(failed)} of {len(job_ids)} jobs completed"
                  + (f"; not completed: {', '.join(f'{j} ({seen[j]})' for j in failed)}" if failed else ""),
                  file=sys.stderr)
            return 1 if failed else 0
        time.sleep(POLL_S)


def _print_new(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data)


def check_eval_submission(cfg: DictConfig, plan: Plan) -> None:
    """At launch: SLURM's verdict (sbatch --test-only) on the evaluation jobs' resources, before training queues."""
    if not jobs_enabled(cfg) or cfg.launcher.dry_run:
        return
    preflight(cfg)
    test_submission(render_script(cfg, plan.run_dir, int(cfg.trainer.max_steps)))
