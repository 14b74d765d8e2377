"""What a run is called and what a refusal quotes: names say what trains, suggestions name only close keys, a run
directory's saved settings are compared key by key (tests/unit/test_bad_inputs.py runs the same as a user types)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.config.suggest import close_key
from contract.errors import ConfigError
from launcher.checks.group_names import settle_names
from launcher.checks.overrides import typed_as, typed_for
from launcher.checks.resume_checks import changed_settings, check_run_dir
from launcher.compose import compose_and_plan, compose_config
from launcher.run.dispatch import dispatch
from launcher.run.rundir import config_yaml

TRAINER = ["max_steps", "micro_batch_size", "grad_accum_steps", "global_batch_size", "seed", "log_every",
           "ckpt_every", "deterministic", "cpu_threads", "prefetch_steps", "progress_bar"]


@pytest.mark.parametrize(("typed", "meant"), [
    ("max_step", "max_steps"), ("max_stepz", "max_steps"), ("microbatch_size", "micro_batch_size"),
    ("batch_size", "micro_batch_size"), ("log_evry", "log_every"), ("logevery", "log_every"), ("seeds", "seed"),
    ("eval_every", None), ("save_every", None), ("eval_steps", None), ("num_steps", None), ("foo", None),
])
def test_suggestions_name_only_keys_close_in_spelling(typed: str, meant: str | None) -> None:
    assert close_key(typed, TRAINER) == meant


def test_a_refusal_finds_the_override_as_typed() -> None:
    with typed_as(["model=tiny", "+eval.every=10", "model.name=x"]):
        assert typed_for("eval") == "+eval.every=10"
        assert typed_for("model.name") == "model.name=x"
        assert typed_for("trainer.seed") is None
    assert typed_for("eval") is None  # only while that config is checked


@pytest.mark.parametrize(("group", "target", "expected"), [
    ("model", "torch.nn.Linear", "Linear"), ("data", "data.CharDataset", "CharDataset"),
])
def test_a_target_over_our_option_is_named_after_itself(group: str, target: str, expected: str) -> None:
    cfg = compose_config([f"{group}._target_={target}"])
    settle_names(cfg)
    assert cfg[group].name == expected


def test_a_target_from_its_own_option_keeps_its_name() -> None:
    cfg = compose_config(["model=hf_causal_lm"])
    settle_names(cfg)
    assert cfg.model.name == "hf_causal_lm"


@pytest.mark.parametrize(("typed", "message"), [
    ("model.name=llama3_8b", "choose the group, model=llama3_8b"),
    ("model.name=mine", "name the run with run.name=mine"),
    ("strategy.name=fsdp", "choose the group, strategy=fsdp"),
])
def test_a_typed_name_is_refused(typed: str, message: str) -> None:
    cfg = compose_config([typed])
    with typed_as([typed]), pytest.raises(ConfigError, match=message):
        settle_names(cfg)


def _saved_run(run_dir: Path, overrides: list[str], step: int | None) -> None:
    cfg, _ = compose_and_plan([f"run.root={run_dir.parent}", f"run.name={run_dir.name}", *overrides])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_yaml(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]
    if step is not None:
        ckpt = run_dir / "checkpoints" / f"step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "COMPLETE").write_text(json.dumps({"step": step}))


def test_settings_that_differ_are_named_with_both_values(tmp_path: Path) -> None:
    _saved_run(tmp_path / "r", ["optim.lr=0.003"], 10)
    old = OmegaConf.load(tmp_path / "r" / "config.yaml")
    new, _ = compose_and_plan([f"run.root={tmp_path}", "run.name=r", "optim.lr=0.001", "trainer.max_steps=500",
                               "trainer.micro_batch_size=4"])
    changes = changed_settings(old, new)  # type: ignore[arg-type]
    assert ("optim.lr", 0.003, 0.001) in changes
    assert ("trainer.micro_batch_size", 8, 4) in changes
    assert not [k for k, _, _ in changes if k == "trainer.max_steps"]  # may change on resume
    with pytest.raises(ConfigError, match=r"optim.lr: 0.003 -> 0.001.*keep the samples a step: "
                       r"trainer.global_batch_size=8 trainer.micro_batch_size=4"):
        check_run_dir(new, tmp_path / "r", 1)


def test_a_damaged_config_without_a_checkpoint_copy_says_to_delete_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("model: {name: tiny}\n")
    cfg, _ = compose_and_plan([f"run.root={tmp_path}", "run.name=r"])
    with pytest.raises(ConfigError, match=r"is damaged \(it has no data section\): delete it"):
        check_run_dir(cfg, run_dir, 1)


def test_a_finished_run_starts_nothing_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    _saved_run(run_dir, ["trainer.max_steps=20"], 20)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cfg = compose_config([f"run.root={tmp_path}", "run.name=r", "trainer.max_steps=20"])
    assert dispatch(cfg, argv=["launcher"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_overwrite_starts_the_run_over_with_no_old_ends_or_attempts(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.run.rundir import clear_for_overwrite

    for name in ("events.jsonl", "local_attempts.txt", "metrics.jsonl"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "logs").mkdir()
    clear_for_overwrite(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]
    # what it deleted is said (a finished run's checkpoints went without a word)
    assert f"run.overwrite=true: deleting metrics.jsonl, events.jsonl, local_attempts.txt of {tmp_path}" in \
        capsys.readouterr().err


def test_the_micro_batch_may_change_on_resume_when_the_global_batch_does_not(tmp_path: Path) -> None:
    """The samples of a step stay the same: a resume on 2 ranks of a 1-rank run with global batch 8 needs micro 4."""
    _saved_run(tmp_path / "r", ["trainer.global_batch_size=8"], 10)
    cfg, _ = compose_and_plan([f"run.root={tmp_path}", "run.name=r", "trainer.global_batch_size=8",
                               "trainer.micro_batch_size=4", "local.nproc=2"])
    check_run_dir(cfg, tmp_path / "r", 2)
    cfg, _ = compose_and_plan([f"run.root={tmp_path}", "run.name=r", "local.nproc=2"])
    with pytest.raises(ConfigError, match=r"trainer.global_batch_size: 8 -> 16.*trainer.global_batch_size=8 trainer.micro_batch_size=4"):
        check_run_dir(cfg, tmp_path / "r", 2)


def test_a_changed_key_at_its_default_shows_the_saved_value(tmp_path: Path) -> None:
    _saved_run(tmp_path / "r", [], 10)
    old = OmegaConf.load(tmp_path / "r" / "config.yaml")
    new, _ = compose_and_plan([f"run.root={tmp_path}", "run.name=r", "optim.schedule=constant"])
    assert ("optim.schedule", "cosine", "constant") in changed_settings(old, new)  # type: ignore[arg-type]
