"""The run directory explains itself: resolved config, the exact command, package versions, git revision."""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import OmegaConfDumper

from contract.errors import ConfigError
from contract.remote_snapshot import DIFF_FILE, snapshot_diff, snapshot_record
from launcher.plan.launch_plan import Plan
from launcher.run.rundir_paths import CLEARED_BY_OVERWRITE, check_writable

PACKAGES = ("slurmtrain", "torch", "hydra-core", "omegaconf", "submitit", "deepspeed", "wandb", "numpy")


@functools.cache  # the same for every point of a sweep
def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@functools.cache
def _git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain"], capture_output=True,
                               text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if rev.returncode:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def clear_for_overwrite(run_dir: Path) -> None:
    """run.overwrite=true: the user asked for a fresh start in this directory; a line says what it deletes (a
    finished run's checkpoints went without a word)."""
    from contract.rundir import ckpt_layout

    found = [c.step for c in ckpt_layout.list_checkpoints(run_dir) if c.complete] if run_dir.is_dir() else []
    gone = [name for name in CLEARED_BY_OVERWRITE if (run_dir / name).exists()]
    if gone:
        held = f"{len(found)} checkpoint(s), the newest of step {max(found)}, " if found else ""
        print(f"run.overwrite=true: deleting {held}{', '.join(n for n in gone if n != 'checkpoints')} of {run_dir}: "
              "the run starts over", file=sys.stderr)
    for name in CLEARED_BY_OVERWRITE:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def write_plan(run_dir: Path, plan: Plan) -> None:
    (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")


class _ConfigDumper(getattr(yaml, "CDumper", yaml.Dumper)):  # type: ignore[misc]
    """OmegaConf.to_yaml's dumper (strings that would read back as numbers or booleans are quoted) on libyaml's
    emitter: a sweep writes one config per point, and the pure-Python emitter took most of that time."""


_ConfigDumper.add_representer(str, OmegaConfDumper.str_representer)


def config_yaml(container: dict[str, Any]) -> str:
    """What OmegaConf.to_yaml writes for this resolved config, without building a config object."""
    return str(yaml.dump(container, Dumper=_ConfigDumper, default_flow_style=False, allow_unicode=True,
                         sort_keys=False))


def replay_command(args: list[str]) -> str:
    """`cd LAUNCH_DIR && PYTHON -m launcher ARGS`: what was typed, where it was typed (relative paths in ARGS, a
    --config-dir and the user's own modules are the launch directory's), so that it replays from anywhere."""
    return f"cd {shlex.quote(os.getcwd())} && " + shlex.join([sys.executable, "-m", "launcher", *args])


def prepare(cfg: DictConfig, run_dir: Path, argv: list[str] | None = None, plan: Plan | None = None) -> Path:
    check_writable(run_dir)  # before run.overwrite deletes anything
    try:
        return _prepare(cfg, run_dir, argv, plan)
    except OSError as err:  # a full disk, a file in the way, a part of it read-only: one line, not a traceback
        where = err.filename or run_dir
        raise ConfigError(f"the run directory {run_dir} can't be prepared ({err.strerror or err}: {where}): make it "
                          "writable and free space there, or pick another run.name or run.root") from None


def _prepare(cfg: DictConfig, run_dir: Path, argv: list[str] | None, plan: Plan | None) -> Path:
    if cfg.run.overwrite:
        clear_for_overwrite(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
    except OSError as err:
        raise ConfigError(f"the run directory {run_dir} can't be created ({err.strerror}): point run.root at a "
                          "directory you can write") from None
    config_path = run_dir / "config.yaml"
    # run.resume=false and run.overwrite=true are one-time choices made at launch and applied just above; the
    # config a requeued job re-reads must resume, never start over or delete what the first attempt saved.
    saved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[assignment]
    saved["run"].update(resume=True, overwrite=False)
    config_path.write_text(config_yaml(saved))
    argv = sys.argv if argv is None else argv
    with (run_dir / "command.txt").open("a") as f:
        f.write(replay_command(argv[1:]) + "\n")
    info = {"python": sys.version.split()[0], "packages": _versions(), "git_revision": _git_revision(),
            "launch_dir": os.getcwd()}
    snapshot = snapshot_record()  # launched on a cluster from a +remote snapshot: which one, of which commit
    if snapshot is not None:
        info["snapshot"] = snapshot
        diff = snapshot_diff()
        if diff:
            (run_dir / DIFF_FILE).write_text(diff)
        else:  # a clean launch resuming a dirty one's run: the old diff would contradict git_dirty
            (run_dir / DIFF_FILE).unlink(missing_ok=True)
    (run_dir / "environment.json").write_text(json.dumps(info, indent=2) + "\n")
    if plan is not None:
        write_plan(run_dir, plan)
    return config_path
