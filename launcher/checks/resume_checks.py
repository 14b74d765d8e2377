"""Re-using a run directory means resuming it: checks of what the directory holds before anything is written.

Refused, each with the safe way out first: a directory whose saved config is damaged (restore it from the newest
checkpoint's copy), a run with other training settings (named, old and new values), a checkpoint trained on other
data (its data fingerprint; data.allow_changed=true lets the data change), a run already past `trainer.max_steps`,
starting over on top of checkpoints without `run.overwrite=true`, and a DeepSpeed checkpoint on another world size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from contract.errors import ConfigError
from contract.rundir import ckpt_layout as layout
from launcher.checks.hydra_errors import yaml_syntax
from launcher.plan.cross_checks import fitting_micro_batch
from launcher.plan.paths import make_absolute
from launcher.plan.run_length import length_key, length_text
from launcher.plan.run_name import training_settings
from launcher.run.rundir_paths import check_writable

# Sections every saved config has: a file without one of them was cut short or is not ours.
REQUIRED = ("model", "data", "optim", "strategy", "precision", "trainer", "run")
SHOWN_CHANGES = 4


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def changed_settings(old: DictConfig, new: DictConfig) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every training setting that differs, each value as its config holds it
    (a key at its default is left out of the settings, not of what is shown). The micro batch may change when the
    global batch does not: the samples of a step stay the same, only the accumulation is re-derived (a resume on
    another world size may need it)."""
    a, b = _flat(training_settings(old)), _flat(training_settings(new))
    shown_a = _flat(OmegaConf.to_container(old, resolve=True))
    shown_b = _flat(OmegaConf.to_container(new, resolve=True))
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    if "trainer.global_batch_size" not in keys:
        keys = [k for k in keys if k != "trainer.micro_batch_size"]
    return [(k, shown_a.get(k, a.get(k)), shown_b.get(k, b.get(k))) for k in keys]


def parse_saved_config(path: Path) -> DictConfig | str:
    """The saved config.yaml, or why the launcher can't resume from it (one short reason: damaged)."""
    try:
        old = OmegaConf.load(path)
        if not isinstance(old, DictConfig):
            raise ValueError("it is not a mapping of sections")
        missing = [s for s in REQUIRED if not isinstance(old.get(s), DictConfig)]
        if missing:
            raise ValueError(f"it has no {missing[0]} section")
        training_settings(old)  # every interpolation resolves
        return old
    except Exception as err:  # noqa: BLE001 - whatever the damage, the user gets one line and the way out
        text = str(err).strip()
        syntax = yaml_syntax(f"yaml.parser.ParserError: {text}") if isinstance(err, yaml.YAMLError) else None
        reason = syntax.replace(f"{path}, ", "") if syntax else text.splitlines()[0] if text else type(err).__name__
        return reason[:160]


def damaged_config(path: Path, run_dir: Path, reason: str) -> str:
    """`PATH is damaged (why): the way out`: restore it from the newest complete checkpoint's copy (the exact cp
    command), or, with no copy, delete it. The launcher, launcher.status and launcher.report all say it so."""
    copies = [c for c in layout.list_checkpoints(run_dir) if c.complete and (c.path / "config.yaml").is_file()]
    if copies:
        fix = f"restore it from the newest checkpoint's copy (cp {copies[-1].path / 'config.yaml'} {path})"
    else:
        fix = "delete it (no checkpoint of this run holds a copy: the run starts over)"
    return f"{path} is damaged ({reason}): {fix}"


def _load_saved(path: Path, run_dir: Path) -> DictConfig:
    """The saved config.yaml, or one line saying it is damaged and how to restore it."""
    saved = parse_saved_config(path)
    if isinstance(saved, str):
        raise ConfigError(f"{damaged_config(path, run_dir, saved)}, or pick another run.name")
    return saved


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _keep_global_batch(cfg: DictConfig, world: int, kept: int) -> str:
    """How to resume on `world` ranks with the saved global batch: the largest micro batch, at most the configured
    one, that divides it over the data-parallel ranks (the accumulation is re-derived), or the world sizes that can."""
    p = cfg.parallel
    dp = max(1, world // (int(p.tp) * int(p.pp) * int(p.get("cp", 1))))
    fitting = fitting_micro_batch(kept, dp, int(cfg.trainer.micro_batch_size))
    if fitting is None:
        sizes = [str(n) for n in range(1, kept + 1) if kept % n == 0][:8]
        listed = ", ".join(sizes[:-1]) + f" or {sizes[-1]}" if len(sizes) > 1 else sizes[0]
        return (f"to resume on another world size keep the samples a step, and trainer.global_batch_size={kept} does "
                f"not divide over {dp} data-parallel ranks: resume on {listed} data-parallel ranks")
    accum = kept // (fitting * dp)
    return (f"to resume on {world} rank(s) keep the samples a step: trainer.global_batch_size={kept} "
            f"trainer.micro_batch_size={fitting} ({kept} = {fitting} x {dp} data-parallel rank(s) x {accum} "
            "accumulation step(s))")


def _differs(run_dir: Path, changes: list[tuple[str, Any, Any]], cfg: DictConfig, world: int) -> ConfigError:
    shown = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in changes[:SHOWN_CHANGES])
    more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    keys = {k for k, _, _ in changes}
    hints = []
    if "trainer.global_batch_size" in keys:
        old = next(a for k, a, _ in changes if k == "trainer.global_batch_size")
        hints.append(_keep_global_batch(cfg, world, int(old)) if isinstance(old, int) else
                     f"to resume on another world size keep trainer.global_batch_size={old}")
    hints.append("to resume it go back to the saved values (trainer.max_steps or its token or epoch budget, "
                 "trainer.log_every, trainer.ckpt_every, the layout and the cluster may change on resume)")
    if any(_data_choice(k) for k in keys):
        hints.append("to resume it on this data add data.allow_changed=true")
    return ConfigError(
        f"{run_dir} holds a run with other training settings ({shown}{more}): pick another run.name (or run.root) to "
        f"train these settings apart; {'; '.join(hints)}; run.overwrite=true deletes its checkpoints and starts over"
    )


def _data_choice(key: str) -> bool:
    """Keys that say which data is read: data.allow_changed=true lets them change on resume."""
    return key in ("data.path", "data.dtype") or key.startswith("data.sources")


def check_data_unchanged(cfg: DictConfig, run_dir: Path) -> None:
    """The newest checkpoint was trained on the data this config reads (its fingerprint, contract/data/fingerprint.py;
    also in a directory without config.yaml, where a checkpoint was copied in)."""
    from contract.data.fingerprint import refuse_changed_data

    latest = layout.latest_complete_checkpoint(run_dir)
    if latest is not None and cfg.run.resume and not cfg.run.overwrite:
        refuse_changed_data(cfg.data, latest.path, latest.step)


def check_run_dir(cfg: DictConfig, run_dir: Path, world: int) -> None:
    check_writable(run_dir)
    existing = run_dir / "config.yaml"
    if existing.exists() and not existing.is_file():
        raise ConfigError(f"{existing} is not a file: move it away (the run's config is written there), or pick "
                          "another run.name")
    if not existing.is_file() or cfg.run.overwrite:
        check_data_unchanged(cfg, run_dir)
        return
    old = _load_saved(existing, run_dir)
    make_absolute(old)  # a config.yaml written before paths were made absolute at launch: as the same command reads them
    changes = changed_settings(old, cfg)
    if cfg.data.get("allow_changed"):
        changes = [c for c in changes if not _data_choice(c[0])]
    if changes:
        raise _differs(run_dir, changes, cfg, world)
    latest = layout.latest_complete_checkpoint(run_dir)
    if latest is None:
        return
    if not cfg.run.resume:
        raise ConfigError(
            f"{run_dir} has a checkpoint at step {latest.step} and run.resume=false: pick another run.name to start "
            "a new run, or add run.overwrite=true to delete it and start over"
        )
    check_data_unchanged(cfg, run_dir)
    if latest.step > cfg.trainer.max_steps:
        raise ConfigError(
            f"{run_dir} is already at step {latest.step} (its newest checkpoint), past {length_text(cfg)}: raise "
            f"{length_key(cfg)} past step {latest.step} to train on, or pick another run.name for a new run"
        )
    if cfg.strategy.backend == "deepspeed":
        saved_world = json.loads((latest.path / layout.MARKER).read_text()).get("world_size")
        if saved_world != world:
            raise ConfigError(
                f"the checkpoint at step {latest.step} was written by {saved_world} ranks and DeepSpeed checkpoints "
                f"resume only on {saved_world} ranks (this run has {world}): run with world size {saved_world}, or "
                "use a DCP strategy (ddp, fsdp, fsdp_grad_op, hsdp) to change the world size"
            )


def finished_step(cfg: DictConfig, run_dir: Path) -> int | None:
    """The step of a run that already reached trainer.max_steps (nothing to train), else None."""
    if not cfg.run.resume or cfg.run.overwrite or not (run_dir / "config.yaml").is_file():
        return None
    latest = layout.latest_complete_checkpoint(run_dir)
    return latest.step if latest is not None and latest.step >= cfg.trainer.max_steps else None
