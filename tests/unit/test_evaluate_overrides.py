"""launcher.evaluate's eval.* overrides that Hydra can't merge are one line naming the key and the fix, worded as
`python -m launcher` words them (launcher/checks/hydra_errors.py): found by typing
`launcher.evaluate RUN eval.harness.tasks=count_mc`, which said only `Error merging override
eval.harness.tasks=count_mc: see python -m launcher.evaluate --help`."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.evaluate import with_overrides


@pytest.mark.parametrize("override, words", [
    ("eval.every=x", "eval.every=x: eval.every takes a whole number and 'x' is not one: write eval.every=N"),
    ("eval.bogus=1", "eval.bogus is not a slurmtrain key"),
    ("eval.harness.tasks=count_mc", "eval.harness.tasks=count_mc is one value and eval.harness.tasks takes a list: "
                                    "write eval.harness.tasks=[count_mc]"),
])
def test_an_override_hydra_refuses_names_the_key_and_the_fix(override: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        with_overrides(OmegaConf.create({}), [override], [])
    message = str(err.value)
    assert message.startswith(words) and "\n" not in message and not message.startswith("error:"), message


def test_a_list_key_given_one_value_says_to_write_a_list() -> None:
    """The training launch's wording too (Hydra's text as it prints it): `optim.no_decay=norm`."""
    from launcher.checks.hydra_errors import one_line

    text = ("Error merging override optim.no_decay=norm\nInvalid value assigned: str is not a ListConfig, list or "
            "tuple.\n    full_key: optim.no_decay\n    object_type=OptimConfig\n")
    assert one_line(text) == ("error: optim.no_decay=norm is one value and optim.no_decay takes a list: write "
                              "optim.no_decay=[norm]")
