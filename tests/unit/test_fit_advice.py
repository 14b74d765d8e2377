"""A run that fits with no strategy or micro batch is told the change that makes it fit (issue 48, item 20):
`local.nproc=1000` splits this host's memory a thousand ways (the fix: fewer local ranks), a sequence of 10^8
tokens needs terabytes of activations (the fix: a shorter one); "a smaller model or more, larger GPUs" is kept for
what neither fixes. Each suggested value is checked: launched as suggested, the run fits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan

BASE = ["model=tiny"]


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as refused:
        compose_and_plan([*BASE, *overrides])
    return str(refused.value)


def test_too_many_local_ranks_are_told_how_many_fit(tmp_path: Path) -> None:
    said = _refusal(["local.nproc=1000", f"run.root={tmp_path}"])
    assert "does not fit" in said and "smaller model" not in said, said
    fix = re.search(r"use local\.nproc=(\d+)", said)
    assert fix, said
    nproc = int(fix.group(1))
    assert 1 <= nproc < 1000
    _, plan = compose_and_plan([*BASE, f"local.nproc={nproc}", f"run.root={tmp_path}"])
    assert plan.fit is not None and plan.fit.fits


@pytest.mark.parametrize("overrides", [["model.max_seq_len=100000000"],
                                       ["model.max_seq_len=100000000", "data.seq_len=100000000"]])
def test_a_sequence_too_long_is_told_the_length_that_fits(overrides: list[str], tmp_path: Path) -> None:
    said = _refusal([*overrides, f"run.root={tmp_path}"])
    assert "smaller model" not in said, said
    fix = re.search(r"use (model\.max_seq_len=(\d+)(?: data\.seq_len=(\d+))?)", said)
    assert fix, said
    _, plan = compose_and_plan([*BASE, *fix.group(1).split(), f"run.root={tmp_path}"])
    assert plan.fit is not None and plan.fit.fits


def test_what_only_a_smaller_model_fixes_still_says_so(tmp_path: Path) -> None:
    said = _refusal(["model=llama3_70b", f"run.root={tmp_path}"])
    assert "use a smaller model or more, larger GPUs" in said, said
