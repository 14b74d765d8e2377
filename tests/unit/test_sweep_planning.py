"""Planning a sweep shares work between its points (one composition per config-group choice, each override parsed
once, the schema read once); every point must still get the verdict and the plan of its own values. What planning a
point costs is `python -m bench sweep_planning`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from launcher.checks.key_checks import check_keys, plain_select
from launcher.compose import compose_and_plan, compose_config
from launcher.plan.run_name import NAME_ONLY_IF_SET
from tests.conftest import hq, launch


@pytest.mark.parametrize(("swept", "bad", "expect"), [
    # The bad value first, in the middle, last: no point inherits another's verdict.
    (("trainer.seed=-1,3,5",), "0 (trainer.seed=-1)", "trainer.seed=-1 is out of range"),
    (("trainer.seed=3,-1,5",), "1 (trainer.seed=-1)", "trainer.seed=-1 is out of range"),
    (("trainer.seed=3,5,-1",), "2 (trainer.seed=-1)", "trainer.seed=-1 is out of range"),
    # An entry of a ranged list.
    (("+profile=default", "profile.ranks=[0],[0,-2]"), "1 (profile.ranks=[0,-2])", "profile.ranks[1]=-2 is out of range"),
    # A ranged entry that interpolates the swept key: the point's override touches trainer, the refusal is cluster's.
    (("trainer.seed=1,0", "+cluster.peak_tflops.x=${trainer.seed}"), "1 (trainer.seed=0)",
     "cluster.peak_tflops.x=0 is out of range: set cluster.peak_tflops.x to a value above 0"),
])
def test_each_point_gets_the_verdict_of_its_own_values(tmp_path: Path, swept: tuple[str, ...], bad: str,
                                                       expect: str) -> None:
    root = tmp_path / "runs"
    out = launch("-m", *swept, "+cluster=a100x16", "launcher.dry_run=true", f"run.root={hq(root)}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: sweep point {bad}: {expect}"), out.stderr
    assert not root.exists()


def _steady(summary: str) -> str:
    return re.sub(r"of [0-9.]+ GB \(this host's available memory", "of N GB (this host's available memory", summary)


def test_each_point_gets_the_plan_of_its_own_values(tmp_path: Path) -> None:
    """Points that differ in a checked key (the micro batch, which sizes the batch, the memory estimate and the run
    name) each print the plan its own single-run command makes."""
    root = tmp_path / "runs"
    fixed = ["trainer.max_steps=3", "local.nproc=2", f"run.root={root}"]
    out = launch("-m", "trainer.micro_batch_size=1,2,4", *fixed, "launcher.dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = re.findall(r"^sweep point (\d+) \((.+?)\): starts\n(plan: .+?)(?=^sweep point |^dry run: )", out.stderr,
                         re.MULTILINE | re.DOTALL)
    assert [int(i) for i, _, _ in printed] == [0, 1, 2], out.stderr
    summaries = set()
    for _, label, summary in printed:
        _, plan = compose_and_plan([label, *fixed])
        # This host's available memory moves between the two moments the plans are made: compared without it.
        assert _steady(summary.strip()) == _steady(plan.summary()), label
        summaries.add(summary)
    assert len(summaries) == 3


def test_an_interpolated_entry_of_a_ranged_key_is_checked_as_it_resolves() -> None:
    cfg = compose_config(["+cluster=a100x16", "trainer.seed=0", "+cluster.peak_tflops.x=${trainer.seed}"])
    with pytest.raises(ConfigError, match=r"cluster.peak_tflops.x=0 is out of range"):
        check_keys(cfg)
    check_keys(compose_config(["+cluster=a100x16", "trainer.seed=2", "+cluster.peak_tflops.x=${trainer.seed}"]))


@pytest.mark.parametrize("overrides", [
    [], ["optim.schedule=wsd", "optim.decay_fraction=0.3", "model.block=Block"],
    ["data=tokens", "data.path=/x/y.bin", "+data.sources.a.path=/a.bin", "+data.sources.a.weight=1"],
    ["optim.timescale=???", "model.block=???", "optim.reference_batch_size=null"],  # missing values, a null
])
def test_plain_select_reads_what_omegaconf_select_reads(overrides: list[str]) -> None:
    """The run name leaves out a NAME_ONLY_IF_SET key at its default, read from the resolved config: the same
    reading as OmegaConf.select, or run names (and with them every run's directory) would move."""
    cfg = compose_config(overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    for key, default in NAME_ONLY_IF_SET.items():
        for fallback in (default, "fallback"):
            assert plain_select(data, key, fallback) == OmegaConf.select(cfg, key, default=fallback), key
    for key in ("model", "model.nope.deeper", "trainer.seed", "cluster.nodes", "data.seq_len"):
        assert plain_select(data, key) == OmegaConf.select(cfg, key), key


def test_multirun_flag_after_the_overrides_is_a_sweep(tmp_path: Path) -> None:
    """`python -m launcher trainer.max_steps=3 -m optim.lr=1e-3,3e-3`: -m typed after an override sweeps as it does
    first on the line, rather than argparse's "unrecognized arguments" over several lines."""
    out = launch("trainer.max_steps=3", "-m", "optim.lr=1e-3,3e-3", "launcher.dry_run=true",
                 f"run.root={hq(tmp_path / 'runs')}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "sweep point 1 (optim.lr=0.003)" in out.stderr and "dry run: nothing run for sweep" in out.stderr
