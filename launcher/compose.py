"""Compose the config outside `python -m launcher` (tests, benchmarks, notebooks): same groups, same checks."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.version import VersionBase
from omegaconf import DictConfig

from launcher.config_store import register
from launcher.plan.launch_plan import Plan, make_plan

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    register()
    # Hydra keeps the version base process-wide: left at ours, a later Hydra app in the same process (a test suite,
    # a notebook) would run with this version's defaults instead of its own (hydra.job.chdir among them).
    version = VersionBase.instance()
    before = version.getbase()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name="config", overrides=list(overrides or []))
    finally:
        version.version_base = before


def compose_and_plan(overrides: list[str] | None = None) -> tuple[DictConfig, Plan]:
    cfg = compose_config(overrides)
    return cfg, make_plan(cfg)
