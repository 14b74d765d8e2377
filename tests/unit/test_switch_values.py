"""A true/false key typed with a number is refused (OmegaConf would read stability.enabled=2 as true)."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from launcher.checks.key_checks import bool_keys, check_typed_switches
from launcher.checks.overrides import typed_as
from tests.conftest import launch


@pytest.mark.parametrize("override", ["stability.enabled=2", "eval.at_start=-1", "+trainer.deterministic=2.5"])
def test_a_number_for_a_switch_is_refused_naming_both_words(override: str) -> None:
    key = override.split("=")[0].lstrip("+")
    with typed_as([override]), pytest.raises(ConfigError) as err:
        check_typed_switches()
    assert str(err.value) == f"{key}={override.split('=')[1]} is not true or false: set {key}=true or {key}=false"


@pytest.mark.parametrize("value", ["true", "False", "yes", "off", "1", "0", "'true'", "${oc.env:WAIT,true}"])
def test_the_words_a_switch_takes_pass(value: str) -> None:
    with typed_as([f"stability.enabled={value}", "trainer.max_steps=2"]):
        check_typed_switches()


def test_the_schema_switches_are_found() -> None:
    assert {"stability.enabled", "eval.at_start", "run.overwrite", "trainer.deterministic"} <= bool_keys()
    assert "trainer.max_steps" not in bool_keys()


def test_the_cli_refuses_it_in_one_line_and_writes_nothing(tmp_path) -> None:
    out = launch("stability.enabled=2", "launcher.dry_run=true", f"run.root={tmp_path / 'r'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: stability.enabled=2 is not true or false: set "
                                               "stability.enabled=true or stability.enabled=false"]
    assert not (tmp_path / "r").exists()
