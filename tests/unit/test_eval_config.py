"""The eval section's shape and launch refusals (contract/rules/eval_sets.py), and that it is not part of the run name."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from contract.rules.eval_sets import resolved_sets
from launcher.compose import compose_and_plan


def test_eval_is_off_by_default_and_not_part_of_the_run_name() -> None:
    plain, _ = compose_and_plan(["run.root=/tmp/x"])
    with_eval, _ = compose_and_plan(["run.root=/tmp/x", "eval.every=5", "eval.at_start=true",
                                     "eval.sets.held.kind=synthetic"])
    assert plain.eval.every == 0
    assert plain.run.name == with_eval.run.name


def test_named_sets_resolve_and_the_default_is_the_synthetic_held_out_stream() -> None:
    cfg, _ = compose_and_plan(["run.root=/tmp/x", "eval.every=5"])
    assert resolved_sets(cfg) == {"val": {"kind": "synthetic", "seed": int(cfg.data.seed)}}
    cfg, _ = compose_and_plan(["run.root=/tmp/x", "eval.every=5", "eval.sets.a.kind=synthetic", "eval.sets.a.seed=7",
                               "eval.sets.b._target_=my.Dataset"])
    assert resolved_sets(cfg) == {"a": {"kind": "synthetic", "seed": 7},
                                  "b": {"kind": "dataset", "_target_": "my.Dataset"}}


@pytest.mark.parametrize(("overrides", "expected"), [
    (["eval.async_jobs=true", "parallel.pp=2", "local.nproc=2", "model.tie_embeddings=false"],
     "evaluation jobs have no pipeline layout yet"),
    (["eval.every=5", "eval.sets.x.kind=val"], "eval.sets.x.kind=val needs a prepared directory"),
    (["eval.every=5", "eval.sets.x.kind=dataset"], "eval.sets.x.kind=dataset needs eval.sets.x._target_"),
    (["eval.every=5", "data._target_=my.Dataset"], "data._target_ has none: name one"),
])
def test_sets_that_cannot_work_are_refused_at_launch(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        compose_and_plan(["run.root=/tmp/x", *overrides])


def test_a_token_file_without_a_validation_split_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    tokens = tmp_path / "t.bin"
    (np.arange(1000) % 256).astype(np.uint16).tofile(tokens)
    with pytest.raises(ConfigError, match="has no validation split"):
        compose_and_plan(["run.root=/tmp/x", "eval.every=5", "data=tokens", f"data.path={tokens}"])
    with pytest.raises(ConfigError, match="is not a prepared directory"):
        compose_and_plan(["run.root=/tmp/x", "eval.every=5", "data=tokens", f"data.path={tokens}",
                          "eval.sets.x.kind=val", f"eval.sets.x.path={tokens}"])
    cfg, _ = compose_and_plan(["run.root=/tmp/x", "eval.every=5", "data=tokens", f"data.path={tokens}",
                               "eval.sets.x.kind=tokens", f"eval.sets.x.path={tokens}"])
    assert resolved_sets(cfg)["x"]["kind"] == "tokens"


def test_the_plan_says_when_and_on_what_validation_runs(tmp_path) -> None:
    _, plan = compose_and_plan([f"run.root={tmp_path}", "eval.every=5", "eval.at_start=true", "eval.batches=3",
                                "eval.sets.a.kind=synthetic", "eval.sets.a.seed=3", "trainer.micro_batch_size=4",
                                "data.seq_len=16"])
    lines = [line for line in plan.data_lines if line.startswith("validation:")]
    assert lines == ["validation: every 5 steps and at the end, and at step 0, 3 batches of 4 samples (192 tokens) "
                     "per set; a: the synthetic stream's held-out samples (seed 3)"]
    _, quiet = compose_and_plan([f"run.root={tmp_path}"])
    assert not any(line.startswith("validation:") for line in quiet.data_lines)


def test_at_start_alone_validates_at_step_0_and_the_plan_says_nothing_validates_later(tmp_path) -> None:
    """eval.at_start=true without eval.every: the step-0 pass a user asks for to check imported weights."""
    from tests.unit.test_validator_cache import _validator

    cfg, plan = compose_and_plan([f"run.root={tmp_path}", "eval.at_start=true", "eval.batches=2",
                                  "trainer.micro_batch_size=4", "data.seq_len=16"])
    lines = [line for line in plan.data_lines if line.startswith("validation:")]
    assert lines == ["validation: at step 0 only (eval.at_start=true; eval.every=0, so nothing validates later), 2 "
                     "batches of 4 samples (128 tokens) per set; val: the synthetic stream's held-out samples (seed "
                     f"{int(cfg.data.seed)})"]
    validator, _ = _validator(["eval.every=0", "eval.at_start=true", "trainer.max_steps=6"])
    assert list(validator.sets) == ["val"]
    assert [step for step in range(7) if validator.due(step)] == [0]
    assert validator.due_at_start(0, tmp_path)
