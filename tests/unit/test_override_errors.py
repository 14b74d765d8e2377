"""Overrides Hydra refuses before slurmtrain's checks run, answered in slurmtrain's words (issue 48, item 21): a
misspelt section gets its "did you mean", a value given to a whole section and a value of the wrong type get one
line naming the fix, never OmegaConf's wording; exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, hq, launcher_env
from tests.forked_cli import run_module

CASES = [
    ("loca.nproc=2", "loca.nproc is not a slurmtrain key: did you mean local.nproc?"),
    ("optm.lr=1e-3", "did you mean optim.lr?"),
    ("local=2", "local=2: local is a section of keys, not a value: set one of its keys, e.g. local.nproc=2"),
    ("local.nproc=abc", "local.nproc=abc: local.nproc takes a whole number and 'abc' is not one: write local.nproc=N"),
    ("optim.lr=fast", "optim.lr takes a number and 'fast' is not one: write optim.lr=N (its default is 0.003)"),
    ("trainer.deterministic=maybe", "trainer.deterministic is true or false: write trainer.deterministic=true"),
]
OMEGACONF_WORDS = ("Invalid type assigned", "could not be converted", "is not a valid bool", "of its type")


@pytest.mark.parametrize(("override", "expect"), CASES, ids=[c[0] for c in CASES])
def test_hydra_refusals_are_one_slurmtrain_line(override: str, expect: str, tmp_path: Path) -> None:
    out = run_module("launcher", [override, f"run.root={hq(tmp_path)}"], cwd=ROOT, env=launcher_env())
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert expect in lines[0]
    assert not any(words in lines[0] for words in OMEGACONF_WORDS), lines[0]
    assert list(tmp_path.iterdir()) == []
