"""One point of a sweep (or a search's trial): its config composed by the launcher that loads points (PointLoader:
launcher/sweeps/sweep.py's SweepLauncher), validated and planned (PointRun). A bad point raises one line naming it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hydra.core.utils import filter_overrides
from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from contract.errors import ConfigError
from launcher.checks.overrides import typed_as
from launcher.plan.launch_plan import Plan, make_plan
from launcher.sweeps.sweepdir import Point, swept_label


class PointLoader(Protocol):
    """What a sweep needs of the Hydra launcher that runs it: the sweep's config, the directories the command is
    about to create (removed again on bad input), and a point's config composed from its overrides."""

    config: DictConfig | None
    created: list[Path]

    def load_point(self, overrides: Sequence[str]) -> DictConfig: ...


@dataclass
class PointRun:
    point: Point
    cfg: DictConfig
    plan: Plan
    label: str  # the swept values, e.g. `optim.lr=1e-4 strategy=fsdp`
    action: str = ""  # finished | live | run (set by classify)
    detail: str = ""
    live_job: str = ""

    @property
    def run_dir(self) -> Path:
        return self.plan.run_dir


def plan_point(launcher: PointLoader, index: int, overrides: Sequence[str], swept: list[str],
               group: str) -> PointRun:
    point = Point(index=index, overrides=list(filter_overrides(overrides)), run_dir="")
    label = swept_label(point.overrides, swept) or point.label
    try:
        cfg = launcher.load_point(overrides)
    except (HydraException, OmegaConfBaseException) as err:  # a misspelled key, a missing group option
        from launcher.checks.hydra_errors import one_line

        text = str(err) + ("\n" + str(err.__cause__) if err.__cause__ is not None else "")
        message = one_line(text).removeprefix("error: ")
        raise ConfigError(f"sweep point {index} ({label}): {message}") from None
    with open_dict(cfg):
        if not cfg.logger.group:
            cfg.logger.group = group  # each point its own wandb run, grouped by the sweep
    try:
        with typed_as(overrides):
            plan = make_plan(cfg)
        if plan.refusal:
            raise ConfigError(plan.refusal)
    except ConfigError as err:
        raise ConfigError(f"sweep point {index} ({label}): {err}") from None
    except InterpolationResolutionError as err:
        from launcher.checks.hydra_errors import interpolation

        raise ConfigError(f"sweep point {index} ({label}): {interpolation(err)}") from None
    point.run_dir = str(plan.run_dir)
    return PointRun(point, cfg, plan, label)
