"""The launch plan's learning-rate schedule: schedules that can't run are refused, and the plan says what the rate
does over the run and, when a run with checkpoints resumes (an extended one above all), across the old and new steps.

The rates are the training side's own closed forms (contract/rules/schedules.py, no torch), so what the plan says is what
metrics.jsonl will show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contract.config.schema import OptimConfig
from contract.errors import ConfigError
from contract.rules.schedules import LENGTH_FREE, READS, Schedule
from contract.rundir import ckpt_layout as layout
from launcher.checks.overrides import as_typed


def check_schedule(cfg: DictConfig) -> Schedule:
    """The run's schedule, or one line saying why it can't run: a key the schedule ignores, a wsd decay past the
    end or inside the warmup, an inverse square root without a timescale."""
    o = cfg.optim
    for key, readers in READS.items():
        if o.schedule not in readers and o.get(key) != getattr(OptimConfig, key):
            fix = (f"only optim.schedule={readers[0]} reads it): drop it or set optim.schedule={readers[0]}"
                   if len(readers) == 1 else f"{', '.join(readers)} read it): drop it or set one of those")
            raise ConfigError(f"{as_typed(f'optim.{key}', o.get(key))} has no effect on optim.schedule={o.schedule} ({fix}")
    if o.schedule == "wsd" and o.get("decay_start_step") is not None and o.decay_fraction != OptimConfig.decay_fraction:
        raise ConfigError(f"{as_typed('optim.decay_fraction', o.decay_fraction)} has no effect with optim.decay_start_step="
                          f"{o.decay_start_step} (the decay runs from that step to trainer.max_steps): drop one of them")
    schedule = Schedule.from_config(o, cfg.trainer.max_steps)
    refusal = schedule.refusal()
    if refusal:
        raise ConfigError(refusal)
    return schedule


def schedule_note(cfg: DictConfig, peak: float, run_dir: Path) -> str:
    """`; <schedule>` for the plan's learning-rate line, and a line on the resume if the run has a checkpoint."""
    schedule = check_schedule(cfg)
    note = f"; {schedule.describe(peak)}"
    resumed = _resumed_from(cfg, run_dir)
    if resumed is not None:
        note += "\n  " + _across(schedule, peak, *resumed)
    return note


def _resumed_from(cfg: DictConfig, run_dir: Path) -> tuple[int, Schedule, float] | None:
    """(step, schedule, peak rate) of the checkpoint this run resumes from, as it was trained; None without one,
    or when its config can't be read (the resume checks then say why)."""
    if not cfg.run.resume or cfg.run.overwrite:
        return None
    latest = layout.latest_complete_checkpoint(run_dir)
    if latest is None or latest.step >= cfg.trainer.max_steps:
        return None
    try:
        saved: Any = OmegaConf.load(latest.path / "config.yaml")
        o = saved.optim
        return latest.step, Schedule.from_config(o, int(saved.trainer.max_steps)), float(o.get("scaled_lr") or o.lr)
    except Exception:  # noqa: BLE001 - a damaged or foreign file: the plan only leaves the resume out
        return None


def _across(new: Schedule, peak: float, step: int, old: Schedule, old_peak: float) -> str:
    """What the rate does from the checkpoint's step on, against what it did before."""
    after = f"step {step + 1} trains at {peak * new.factor(step):.4g}"
    if new == old and peak == old_peak:
        return f"resumes after step {step}: {after}"
    before = f"step {step} trained at {old_peak * old.factor(step - 1):.4g}" if step > 0 else ""
    return (f"resumes after step {step} of {new.max_steps} (trained so far for trainer.max_steps={old.max_steps}): "
            f"{_change(old, new, step)}; {after}" + (f" ({before})" if before else ""))


def _change(old: Schedule, new: Schedule, step: int) -> str:
    if new.kind in LENGTH_FREE:
        return f"{new.kind} does not depend on trainer.max_steps: the rates are unchanged"
    if new.kind != "wsd":
        return f"{new.kind} decay re-stretched to end at step {new.max_steps} (was {old.max_steps})"
    start, old_start = new.decay_start, old.decay_start
    if start > old_start and step > old_start:  # the checkpoint trained part of the old decay already
        return (f"decay moved to step {start} (was {old_start}), but steps {old_start + 1}-{step} already decayed: "
                "the rate goes back up, it is not a stable phase extended")
    if start > old_start:
        return f"stable phase extended, decay from step {start} (was {old_start})"
    if start < old_start:
        return f"decay moved earlier, from step {start} (was {old_start})"
    if old_start >= old.max_steps:
        return f"decay from step {start}, where the stable phase trained so far ends"
    return f"decay from step {start} re-stretched to end at step {new.max_steps} (was {old.max_steps})"
