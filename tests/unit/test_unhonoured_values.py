"""A value we accept is a value we honour: keys that would do nothing in the config they are given with are
refused at launch, in one line that names the fix."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan

CASES = [
    (["stability.enabled=false", "stability.spike_sigma=6"], "stability.spike_sigma=6 has no effect with "
     "stability.enabled=false"),
    (["stability.enabled=false", "stability.nonfinite=stop"], "stability.nonfinite=stop has no effect with "
     "stability.enabled=false"),
    (["eval.sets.x.kind=synthetic"], "eval.sets.x.kind=synthetic has no effect with eval.every=0 (no validation)"),
    (["optim.schedule=wsd", "optim.decay_start_step=50", "optim.decay_fraction=0.1", "trainer.max_steps=100"],
     "optim.decay_fraction=0.1 has no effect with optim.decay_start_step=50"),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[c[1][:30] for c in CASES])
def test_a_value_that_would_do_nothing_is_refused(tmp_path, overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_and_plan([f"run.root={tmp_path}", *overrides])
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("overrides", [
    ["stability.enabled=false"],
    ["eval.every=5", "eval.at_start=true", "eval.sets.x.kind=synthetic"],
    ["eval.at_start=true", "eval.sets.x.kind=synthetic"],  # step 0 alone: the check of imported weights
    ["optim.schedule=wsd", "optim.decay_start_step=50", "trainer.max_steps=100"],
    ["optim.schedule=wsd", "optim.decay_fraction=0.1"],
])
def test_the_same_keys_where_they_act_are_accepted(tmp_path, overrides: list[str]) -> None:
    compose_and_plan([f"run.root={tmp_path}", *overrides])
