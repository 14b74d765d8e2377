"""A run's length as a token or epoch budget (launcher/plan/run_length.py): the plan converts it to the first step
that reaches it, writes that step into trainer.max_steps (which the schedule, the loop and evaluation jobs read) and
says so; a budget beside trainer.max_steps, or one that can't be counted, is refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from contract.data.mixture import samples_per_source
from contract.errors import ConfigError
from launcher.compose import compose_and_plan
from launcher.plan.run_length import DEFAULT_MAX_STEPS
from tests.conftest import launch

# tiny: 8 sequences of 64 tokens a step on one rank.
BATCH, SEQ = 8, 64
PER_STEP = BATCH * SEQ


def _tokens(path: Path, n: int) -> Path:
    (np.arange(n) % 256).astype(np.uint16).tofile(path)
    return path


def _plan(tmp_path: Path, *overrides: str):  # noqa: ANN202
    return compose_and_plan([f"run.root={tmp_path / 'runs'}", "logger.backend=none", *overrides])


@pytest.mark.parametrize(("budget", "steps"), [(3000, 6), (3072, 6), (3073, 7), (1, 1), (PER_STEP * 250, 250)])
def test_max_tokens_ends_at_the_first_step_whose_tokens_reach_it(tmp_path: Path, budget: int, steps: int) -> None:
    cfg, plan = _plan(tmp_path, f"trainer.max_tokens={budget}")
    assert cfg.trainer.max_steps == plan.max_steps == steps
    assert steps * PER_STEP >= budget > (steps - 1) * PER_STEP
    assert plan.length_line == (f"length: trainer.max_tokens={budget:,} = {steps} steps of {PER_STEP:,} tokens "
                                f"({steps * PER_STEP:,} tokens: step {steps} is the first to reach it)")
    assert f"\n  {plan.length_line}\n" in plan.summary()
    # The schedule ends at that step: the plan's rate line, and the decay's floor reached there.
    assert f"cosine decay toward 0.0003, step {steps} trains at" in plan.lr_note
    assert plan.to_json()["max_steps"] == steps and plan.to_json()["length"] == plan.length_line[len("length: "):]


def test_max_tokens_may_be_typed_as_a_float(tmp_path: Path) -> None:
    cfg, plan = _plan(tmp_path, "trainer.max_tokens=2e6")
    assert cfg.trainer.max_steps == math.ceil(2e6 / PER_STEP) and "trainer.max_tokens=2,000,000 = 3907" in plan.length_line


def test_without_a_budget_the_length_is_max_steps_or_its_default(tmp_path: Path) -> None:
    cfg, plan = _plan(tmp_path)
    assert cfg.trainer.max_steps == DEFAULT_MAX_STEPS == 100 and plan.length_line == ""
    cfg, _ = _plan(tmp_path, "trainer.max_steps=7")
    assert cfg.trainer.max_steps == 7


def test_the_budget_is_not_part_of_the_run_name(tmp_path: Path) -> None:
    """The same command with a larger budget extends the run: one directory for all of them."""
    names = {_plan(tmp_path, *o)[0].run.name for o in (["trainer.max_steps=6"], ["trainer.max_tokens=3000"],
                                                      ["trainer.max_tokens=9000"])}
    data = _tokens(tmp_path / "t.bin", 20_000)
    names_data = {_plan(tmp_path, "data=tokens", f"data.path={data}", *o)[0].run.name
                  for o in (["trainer.max_steps=3"], ["trainer.max_epochs=1"], ["trainer.max_tokens=100"])}
    assert len(names) == 1 and len(names_data) == 1


def test_max_epochs_of_data_path(tmp_path: Path) -> None:
    data = _tokens(tmp_path / "t.bin", 20_000)
    windows = (20_000 - 1) // SEQ  # samples of seq_len + 1 tokens (contract/data/spec.py)
    for epochs in (1, 2.5, 0.1):
        cfg, plan = _plan(tmp_path, "data=tokens", f"data.path={data}", f"trainer.max_epochs={epochs}")
        steps = math.ceil(math.ceil(epochs * windows) / BATCH)
        assert cfg.trainer.max_steps == steps
        assert plan.length_line.startswith(f"length: trainer.max_epochs={epochs:g} of data.path ({windows:,} samples) "
                                           f"= {steps} steps of {BATCH} samples")
        # The plan's data line counts the same samples: at least that many epochs, less one step's worth.
        assert steps * BATCH >= epochs * windows > (steps - 1) * BATCH


def test_max_epochs_of_a_mixture_source(tmp_path: Path) -> None:
    a, b = _tokens(tmp_path / "a.bin", 40_000), _tokens(tmp_path / "b.bin", 6_000)
    mixture = [f"data.sources.a.path={a}", "data.sources.a.weight=0.8", f"data.sources.b.path={b}",
               "data.sources.b.weight=0.2", "data=tokens"]
    b_windows = (6_000 - 1) // SEQ
    cfg, plan = _plan(tmp_path, *mixture, "trainer.max_epochs=1", "trainer.epochs_of=b")
    steps = cfg.trainer.max_steps
    given = samples_per_source([0.8, 0.2], steps * BATCH)[1]
    assert given >= b_windows > samples_per_source([0.8, 0.2], (steps - 1) * BATCH)[1]  # the first step that does
    assert plan.length_line.startswith(f"length: trainer.max_epochs=1 of data.sources.b ({b_windows} samples, weight "
                                       f"0.2) = {steps} steps of {BATCH} samples ({steps * BATCH:,} samples, {given} "
                                       "of them b")


@pytest.mark.parametrize(("overrides", "expected"), [
    (["trainer.max_tokens=3000", "trainer.max_steps=4"],
     "trainer.max_steps=4 and trainer.max_tokens=3000 are both set: the token budget is converted to steps by the "
     "plan: drop trainer.max_steps"),
    (["trainer.max_epochs=2", "trainer.max_steps=4", "data=tokens", "data.path=DATA"],
     "trainer.max_steps=4 and trainer.max_epochs=2 are both set: the epoch budget is converted to steps by the plan: "
     "drop trainer.max_steps"),
    (["trainer.max_tokens=3000", "trainer.max_epochs=1"],
     "trainer.max_tokens=3000 and trainer.max_epochs=1 are both set: keep one budget"),
    (["trainer.max_tokens=1000.5"], "trainer.max_tokens=1000.5 is not a whole number of tokens: set "
     "trainer.max_tokens=1001"),
    (["trainer.max_tokens=0"], "trainer.max_tokens=0 is out of range"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 is out of range"),
    (["trainer.epochs_of=a"], "trainer.epochs_of=a has no effect without trainer.max_epochs"),
    (["trainer.max_epochs=1"], "trainer.max_epochs counts passes over the data's samples, and data=synthetic is an "
     "endless stream: set trainer.max_tokens or trainer.max_steps"),
    (["trainer.max_epochs=1", "trainer.epochs_of=a", "data=tokens", "data.path=DATA"],
     "trainer.epochs_of=a names a source of a mixture, and data.path is the one source: drop trainer.epochs_of"),
    (["trainer.max_epochs=1", "data=tokens", "data.sources.a.path=DATA", "data.sources.b.path=DATA"],
     "trainer.max_epochs=1 with a mixture counts passes over one source: add trainer.epochs_of=NAME (one of a, b)"),
    (["trainer.max_epochs=1", "trainer.epochs_of=c", "data=tokens", "data.sources.a.path=DATA",
      "data.sources.b.path=DATA"], "trainer.epochs_of=c is not a source of data.sources: set trainer.epochs_of= one "
     "of a, b"),
    (["trainer.max_epochs=1", "trainer.epochs_of=b", "data=tokens", "data.sources.a.path=DATA",
      "data.sources.b.path=DATA", "data.sources.b.weight=0"], "trainer.epochs_of=b: data.sources.b.weight is 0, so "
     "the run never reads it"),
])
def test_budgets_that_contradict_or_cant_be_counted_are_refused(tmp_path: Path, overrides: list[str],
                                                               expected: str) -> None:
    data = _tokens(tmp_path / "t.bin", 20_000)
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, *(o.replace("DATA", str(data)) for o in overrides))
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_repeat_warning_names_the_budget_and_leaves_out_the_epochs_asked_for(tmp_path: Path) -> None:
    a, b = _tokens(tmp_path / "a.bin", 40_000), _tokens(tmp_path / "b.bin", 6_000)
    mixture = ["data=tokens", f"data.sources.a.path={a}", "data.sources.a.weight=0.8", f"data.sources.b.path={b}",
               "data.sources.b.weight=0.2"]
    _, plan = _plan(tmp_path, *mixture, "trainer.max_epochs=3", "trainer.epochs_of=b")
    warnings = [line for line in plan.data_lines if line.startswith("warning:")]
    assert warnings == ["warning: data.sources.a repeats: the run reads its 624 samples 1.79 times over; add data or "
                        "lower trainer.max_epochs"]  # b's 3 epochs were asked for
    _, plan = _plan(tmp_path, "data=tokens", f"data.path={b}", "trainer.max_epochs=3")
    assert not [line for line in plan.data_lines if line.startswith("warning:")]
    _, plan = _plan(tmp_path, "data=tokens", f"data.path={b}", "trainer.max_tokens=100000")
    assert plan.data_lines[-1].endswith("times over; add data or lower trainer.max_tokens")


def test_max_epochs_of_a_users_dataset_counts_its_len(byo_project: Path, tmp_path: Path) -> None:
    """data._target_: an epoch is the dataset's len() (sample i is item i mod len), read by the plan's probe."""
    import sys

    sys.path.insert(0, str(byo_project))
    try:
        from data import CharDataset  # examples/byo_project/data.py, as the ranks build it

        size = len(CharDataset(seq_len=SEQ))
    finally:
        sys.path.remove(str(byo_project))
    command = ["--config-dir", "conf", "model=conv_lm", "data=chars", "trainer.max_epochs=2", "launcher.dry_run=true",
               f"run.root={tmp_path / 'runs'}"]
    out = launch(*command, cwd=byo_project)
    steps = math.ceil(2 * size / BATCH)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (f"length: trainer.max_epochs=2 of data._target_=data.CharDataset ({size} samples) = {steps} steps of "
            f"{BATCH} samples") in out.stderr
    forced = launch(*command, "launcher.force=true", cwd=byo_project)
    assert forced.returncode == 2 and forced.stderr.count("\n") == 1
    assert "launcher.force=true skips reading it at launch" in forced.stderr
