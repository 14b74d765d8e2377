"""A run resumed on another world size is told the global batch to keep and the micro batch that divides it
(issue 48, item 22): the hint said "trainer.micro_batch_size may change", and with 4 ranks the plan then refused
the global batch it kept. The hint's overrides, typed as given, resume the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.checks.resume_checks import check_run_dir
from launcher.compose import compose_and_plan
from launcher.run.rundir import config_yaml


def _saved_run(run_dir: Path, overrides: list[str]) -> None:
    cfg, _ = compose_and_plan([f"run.root={run_dir.parent}", f"run.name={run_dir.name}", *overrides])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_yaml(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]
    ckpt = run_dir / "checkpoints" / "step_10"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 10}))


@pytest.mark.parametrize(("before", "after", "micro"), [(2, 4, 4), (2, 8, 2), (4, 2, 8)])
def test_the_hint_names_the_micro_batch_that_divides_the_kept_global_batch(tmp_path: Path, before: int, after: int,
                                                                          micro: int) -> None:
    run = [f"run.root={tmp_path}", "run.name=r", "trainer.micro_batch_size=8"]
    _saved_run(tmp_path / "r", [f"local.nproc={before}", "trainer.micro_batch_size=8"])
    new, plan = compose_and_plan([*run, f"local.nproc={after}"])
    with pytest.raises(ConfigError) as refused:
        check_run_dir(new, tmp_path / "r", plan.world_size)
    said = str(refused.value)
    kept = 8 * before
    fix = re.search(r"resume on \d+ rank\(s\) keep the samples a step: (trainer\.global_batch_size=(\d+) trainer\.micro_batch_size=(\d+))",
                    said)
    assert fix, said
    assert (int(fix.group(2)), int(fix.group(3))) == (kept, micro)
    assert "micro_batch_size may change" not in said
    resumed, plan = compose_and_plan([*run, f"local.nproc={after}", *fix.group(1).split()])
    check_run_dir(resumed, tmp_path / "r", plan.world_size)  # accepted: the same global batch, a micro batch that fits
    assert plan.global_batch_size == kept


def test_a_global_batch_no_micro_batch_divides_says_which_world_sizes_do(tmp_path: Path) -> None:
    _saved_run(tmp_path / "r", ["local.nproc=2", "trainer.micro_batch_size=3"])  # global batch 6
    new, plan = compose_and_plan([f"run.root={tmp_path}", "run.name=r", "local.nproc=4", "trainer.micro_batch_size=3"])
    with pytest.raises(ConfigError, match=r"trainer.global_batch_size=6 does not divide over 4 data-parallel ranks: "
                                          r"resume on 1, 2, 3 or 6"):
        check_run_dir(new, tmp_path / "r", plan.world_size)


@pytest.mark.parametrize("typed", ["16", "24", "32"])
def test_a_resume_given_only_the_global_batch_is_told_a_micro_batch_that_resumes(tmp_path: Path, typed: str) -> None:
    """The batch check before the resume check said "pick a global batch that is a multiple of 32", a value the
    resume check then refused (the run keeps 16): both now name the saved global batch and the micro batch that
    divides it over 4 ranks, and those overrides resume the run."""
    _saved_run(tmp_path / "r", ["local.nproc=2", "trainer.global_batch_size=16"])
    run = [f"run.root={tmp_path}", "run.name=r", "local.nproc=4"]
    with pytest.raises(ConfigError) as refused:
        new, plan = compose_and_plan([*run, f"trainer.global_batch_size={typed}"])
        check_run_dir(new, tmp_path / "r", plan.world_size)
    said = str(refused.value)
    assert "multiple of 32" not in said, said
    fix = re.search(r"trainer\.micro_batch_size=(\d+)", said)
    assert fix and fix.group(1) == "4", said
    assert "trainer.global_batch_size=16" in said, said
    resumed, plan = compose_and_plan([*run, "trainer.global_batch_size=16", fix.group(0)])
    check_run_dir(resumed, tmp_path / "r", plan.world_size)
    assert plan.global_batch_size == 16
