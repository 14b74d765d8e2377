"""A training sweep: every point composed, validated and planned before anything runs; then the points that are
not finished and not already queued go to SLURM as one job array per resource shape (or run here, one after
another, without `+cluster`). The sweep directory records it all (launcher/sweeps/sweepdir.py).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from contract.errors import EXIT_BAD_INPUT, EXIT_KILLED, EXIT_STOPPED, ConfigError, SweepExit
from contract.rules.sbatch import executor_parameters, job_python
from contract.rundir import ckpt_layout as layout
from launcher.checks import resume_checks
from launcher.checks.overrides import override_key
from launcher.plan.launch_plan import Plan
from launcher.run import rundir, slurm
from launcher.run.remote.hints import follow_command
from launcher.sweeps.points import PointLoader, PointRun, plan_point
from launcher.sweeps.summary import print_summary
from launcher.sweeps.sweepdir import Array, Sweep, load_sweep, save_sweep


def launch_training(launcher: PointLoader, job_overrides: Sequence[Sequence[str]],
                    initial_job_idx: int) -> list[JobReturn]:
    assert launcher.config is not None
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).expanduser().resolve()
    try:
        name = str(launcher.config.launcher.sweep_name or "")
        if "/" in name or name in (".", ".."):
            raise ConfigError(f"launcher.sweep_name={name!r} must be a plain directory name: drop the slashes")
        swept = swept_keys(launcher.config.hydra.overrides.task)
        if not job_overrides:
            raise ConfigError("the sweep has no points (an empty range or list): give every swept key at least one "
                              "value")
        group = Path(str(launcher.config.hydra.sweep.dir)).name  # each point's wandb group: read once, not per point
        points = [plan_point(launcher, initial_job_idx + i, overrides, swept, group)
                  for i, overrides in enumerate(job_overrides)]
        check_points(points)
        sweep = record(sweep_dir, points, swept)
        for p in points:
            classify(p)
        if points[0].cfg.launcher.dry_run:
            discard_new_sweep_dir(sweep_dir, launcher.created)
        elif points[0].cfg.cluster is None:
            save_sweep(sweep_dir, sweep)
        if points[0].cfg.cluster is None:
            code = run_here(points, sweep_dir)
        else:
            code = submit_arrays(points, sweep, sweep_dir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        discard_new_sweep_dir(sweep_dir, launcher.created)
        raise SweepExit(EXIT_BAD_INPUT) from None
    if code:
        raise SweepExit(code)
    return [JobReturn(overrides=p.point.overrides, status=JobStatus.COMPLETED, _return_value=p.action)
            for p in points]


def discard_new_sweep_dir(sweep_dir: Path, created: list[Path]) -> None:
    """Bad input leaves nothing behind: Hydra made the sweep directory (multirun.yaml) before any point was
    checked; a sweep that never recorded anything removes it again, with the parents this command created."""
    if (sweep_dir / "sweep.json").exists():
        return
    (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
    for path in created:
        try:
            path.rmdir()
        except OSError:
            return


def check_points(points: list[PointRun]) -> None:
    modes = {p.cfg.cluster is None for p in points}
    if len(modes) > 1:
        raise ConfigError("some sweep points have +cluster and some do not: sweep either on SLURM or locally, "
                          "not both in one command")
    seen: dict[Path, PointRun] = {}
    for p in points:
        if p.run_dir in seen:
            other = seen[p.run_dir]
            raise ConfigError(
                f"sweep points {other.point.index} ({other.label}) and {p.point.index} ({p.label}) would "
                f"train in the same run directory {p.run_dir} (the swept keys do not change what is trained): "
                "sweep a setting that changes training, or run these points as separate commands with their own run.name "
                "(or run.root)"
            )
        seen[p.run_dir] = p


def swept_keys(task_overrides: Sequence[str]) -> list[str]:
    """The keys the sweep command sweeps (`optim.lr=1e-4,3e-4`, `range(...)`, `choice(...)`), in its order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([str(o) for o in task_overrides])
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


def record(sweep_dir: Path, points: list[PointRun], swept: list[str]) -> Sweep:
    """The sweep directory's record, merged with what an earlier run of the same sweep (or an earlier batch of
    this one, with hydra.sweeper.max_batch_size) recorded."""
    sweep = Sweep(name=sweep_dir.name, command=rundir.replay_command(sys.argv[1:]), swept=swept,
                  points=[p.point for p in points])
    if (sweep_dir / "sweep.json").is_file():
        old = load_sweep(sweep_dir)
        jobs = {pt.run_dir: pt.jobs for pt in old.points}
        for p in points:
            p.point.jobs = list(jobs.get(p.point.run_dir, []))
        batch = {p.point.index for p in points}
        sweep.points = sorted([pt for pt in old.points if pt.index not in batch] + sweep.points,
                              key=lambda pt: pt.index)
        sweep.arrays = old.arrays
    return sweep


def classify(p: PointRun) -> None:
    latest = layout.latest_complete_checkpoint(p.run_dir)
    if p.cfg.run.resume and latest is not None and latest.step >= p.cfg.trainer.max_steps:
        p.action, p.detail = "finished", f"finished at step {latest.step}: skipped"
        return
    live = slurm.live_jobs(p.run_dir)
    if live:
        p.action, p.detail, p.live_job = "live", f"still queued or running as job {live[-1]}: left alone", live[-1]
        return
    try:
        resume_checks.check_run_dir(p.cfg, p.run_dir, p.plan.world_size)
    except ConfigError as err:
        raise ConfigError(f"sweep point {p.point.index} ({p.label}): {err}") from None
    resume = latest.step if (p.cfg.run.resume and latest is not None) else None
    p.action = "run"
    p.detail = f"resumes from step {resume}" if resume is not None else "starts"


def point_command(p: PointRun) -> list[str]:
    """The single-run command that resumes this point, in its wandb group (command.txt)."""
    keys = {override_key(o) for o in p.point.overrides}
    group = [] if "logger.group" in keys else [f"logger.group={p.cfg.logger.group}"]
    return ["launcher", *p.point.overrides, *group]


def _print_points(points: list[PointRun], file: Any = None) -> None:
    for p in points:
        print(f"  point {p.point.index}: {p.label}\n      {p.detail}; run directory {p.run_dir}", file=file)


# ---- SLURM: one array per resource shape
def resources(cfg: DictConfig, plan: Plan) -> dict[str, Any]:
    params = executor_parameters(cfg)
    params.pop("job_name")
    return params


def submit_arrays(points: list[PointRun], sweep: Sweep, sweep_dir: Path) -> int:
    todo = [p for p in points if p.action == "run"]
    shapes: dict[str, list[PointRun]] = defaultdict(list)
    for p in todo:
        shapes[json.dumps(resources(p.cfg, p.plan), sort_keys=True, default=str)].append(p)
    first = points[0]
    if first.cfg.launcher.dry_run:
        _print_points(points, file=sys.stderr)
        return _dry_run(list(shapes.values()), sweep, sweep_dir)
    for group in shapes.values():  # SLURM's verdict on every shape before anything is queued
        try:
            slurm.preflight(group[0].cfg)
            slurm.test_submission(_array_script(group, sweep, sweep_dir))
        except ConfigError as err:
            names = ", ".join(f"{p.point.index} ({p.label})" for p in group)
            raise ConfigError(f"sweep point(s) {names}: {err}") from None
    array_ids = []
    for group in shapes.values():
        array_ids.append(_submit_array(group, sweep, sweep_dir))
        save_sweep(sweep_dir, sweep)
    save_sweep(sweep_dir, sweep)
    print(f"sweep {sweep.name}: {len(points)} points")
    _print_points(points)
    if len(shapes) > 1:
        print(f"the points need {len(shapes)} different SLURM resource shapes: {len(shapes)} arrays "
              f"({', '.join(array_ids)})")
    if not todo:
        print("nothing submitted: every point is finished or still queued")
    print(f"sweep directory: {sweep_dir}\n"
          f"status:          {follow_command('launcher.status', sweep_dir)}\n"
          f"plots:           {follow_command('launcher.report', sweep_dir)}")
    follow = [p.point.jobs[-1] for p in todo] + [p.live_job for p in points if p.action == "live"]
    if first.cfg.launcher.wait and follow:
        return slurm.follow_tasks(follow, follow_command("launcher.status", sweep_dir))
    return 0


def _array_script(group: list[PointRun], sweep: Sweep, sweep_dir: Path) -> str:
    return slurm.render_sbatch(group[0].cfg, group[0].plan, folder=sweep_dir / "slurm", job_name=sweep.name,
                               array_size=len(group))


def _submit_array(group: list[PointRun], sweep: Sweep, sweep_dir: Path) -> str:
    import submitit

    from launcher.worker import run as train_entry

    cfg, plan = group[0].cfg, group[0].plan
    config_paths = [str(rundir.prepare(p.cfg, p.run_dir, argv=point_command(p), plan=p.plan)) for p in group]
    executor = submitit.SlurmExecutor(folder=sweep_dir / "slurm", max_num_timeout=cfg.cluster.max_requeues,
                                      python=job_python(cfg))
    executor.update_parameters(**executor_parameters(cfg), array_parallelism=cfg.cluster.array_parallelism)
    executor.update_parameters(job_name=sweep.name)
    try:
        jobs = executor.map_array(train_entry, config_paths)
    except Exception as err:  # submitit wraps sbatch's refusal; show SLURM's own words, one line
        message = " ".join(str(err).split())
        raise ConfigError(f"sbatch refused the sweep's array: {message[-400:]}") from err
    array_id = str(jobs[0].job_id).split("_")[0]
    for p, job in zip(group, jobs, strict=True):
        p.point.jobs.append(str(job.job_id))
        slurm.record_job(p.run_dir, str(job.job_id))
        p.detail = f"{p.detail}: submitted as {job.job_id}"
    shape = ", ".join(f"{k}={v}" for k, v in resources(cfg, plan).items() if k not in ("setup", "srun_args",
                                                                                      "additional_parameters",
                                                                                      "stderr_to_stdout"))
    sweep.arrays.append(Array(array_id=array_id, points=[p.point.index for p in group], resources=shape,
                              submitted=datetime.now(timezone.utc).isoformat(timespec="seconds")))
    print(f"submitted array {array_id}: {len(group)} tasks, at most {min(len(group), cfg.cluster.array_parallelism)} "
          "at once "
          f"({shape})")
    return array_id


def _dry_run(groups: list[list[PointRun]], sweep: Sweep, sweep_dir: Path) -> int:
    for group in groups:
        print(_array_script(group, sweep, sweep_dir))
        print(f"dry run: this array would run points {', '.join(str(p.point.index) for p in group)}",
              file=sys.stderr)
    print(f"dry run: nothing submitted for sweep {sweep.name} ({len(groups)} array(s), one per resource shape)",
          file=sys.stderr)
    return 0


# ---- no cluster: the points one after another on this machine
def run_here(points: list[PointRun], sweep_dir: Path) -> int:
    from launcher.run.dispatch import dispatch

    if points[0].cfg.launcher.dry_run:
        for p in points:
            print(f"sweep point {p.point.index} ({p.label}): {p.detail}\n{p.plan.summary()}", file=sys.stderr)
        print(f"dry run: nothing run for sweep {sweep_dir.name}", file=sys.stderr)
        return 0
    codes: dict[int, int | None] = {}
    for p in points:
        if p.action != "run":
            print(f"sweep point {p.point.index} ({p.label}): {p.detail}", file=sys.stderr)
            continue
        print(f"sweep point {p.point.index} ({p.label}): {p.detail}", file=sys.stderr)
        codes[p.point.index] = dispatch(p.cfg, argv=point_command(p))
        if codes[p.point.index] in (EXIT_STOPPED, EXIT_KILLED):
            break  # Ctrl-C, a stop signal, a second Ctrl-C: stop the sweep; the same command resumes it
    print_summary(points, codes, sweep_dir)
    for interrupted in (EXIT_KILLED, EXIT_STOPPED):
        if interrupted in codes.values():
            return interrupted
    return 1 if any(codes.values()) else 0
