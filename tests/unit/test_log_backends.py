"""logger.backend: one dashboard, both as a list, or none; anything else, and a wandb key that would do nothing
without wandb, refused at launch in one line (contract/rules/log_backends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.errors import ConfigError
from contract.rules.log_backends import backends
from launcher.compose import compose_and_plan


@pytest.mark.parametrize(("override", "chosen"), [
    ("logger.backend=wandb", ("wandb",)), ("logger.backend=tensorboard", ("tensorboard",)),
    ("logger.backend=none", ()), ("logger.backend=[wandb,tensorboard]", ("wandb", "tensorboard")),
    ("logger.backend=[tensorboard]", ("tensorboard",)), ("logger.backend=[]", ()),
])
def test_the_dashboards_a_run_logs_to(tmp_path: Path, override: str, chosen: tuple[str, ...]) -> None:
    cfg, _ = compose_and_plan([f"run.root={tmp_path}", override])
    assert backends(cfg.logger.backend) == chosen


@pytest.mark.parametrize(("overrides", "expected"), [
    (["logger.backend=tensorbord"], "logger.backend=tensorbord: tensorbord is not one of wandb, tensorboard, none: "
     "set logger.backend=tensorboard"),
    (["logger.backend=[wandb,wandb]"], "logger.backend=[wandb,wandb] names a backend twice"),
    (["logger.backend=[none,tensorboard]"], "logger.backend=[none,tensorboard] mixes none with a backend"),
    (["logger.backend=3"], "logger.backend=3 is not a dashboard name nor a list of them"),
    (["logger.backend={a:1}"], "is not a dashboard name nor a list of them"),
    (["logger.backend=[[wandb]]"], "is not a dashboard name nor a list of them"),
    (["logger.backend=tensorboard", "logger.mode=online"], "logger.mode=online has no effect with logger.backend="
     "tensorboard (only wandb reads it): drop it, or add wandb: logger.backend=[wandb,tensorboard]"),
    (["logger.backend=none", "logger.project=mine"], "logger.project=mine has no effect with logger.backend=none"),
    (["logger.backend=none", "logger.entity=team"], "logger.entity=team has no effect with logger.backend=none"),
])
def test_a_backend_we_do_not_write_is_refused(tmp_path: Path, overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_and_plan([f"run.root={tmp_path / 'runs'}", *overrides])
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_wandb_keys_are_taken_where_wandb_logs(tmp_path: Path) -> None:
    cfg, _ = compose_and_plan([f"run.root={tmp_path}", "logger.backend=[wandb,tensorboard]", "logger.project=mine"])
    assert cfg.logger.project == "mine"
