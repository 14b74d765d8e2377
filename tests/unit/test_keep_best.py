"""Choosing a checkpoint by what was measured (issue 30, item 5): the direction rule (contract/rules/metric_order.py),
the best checkpoint read from the run directory (contract/rundir/measured.py), retention that spares it
(checkpoint.keep_best), the launch's refusals of a metric the run never measures, and `--best` picking it. The real run
whose validation loss turns up: tests/dist/test_keep_best.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from contract.errors import ConfigError
from contract.rules.metric_order import Ranking, known_direction, ranking
from contract.rundir import ckpt_layout as layout
from contract.rundir import eval_results, measured, metrics_file
from launcher.checks.resume_checks import REQUIRED
from launcher.export import pick_checkpoint
from tests.conftest import hq, launcher_env
from tests.forked_cli import run_module


@pytest.mark.parametrize("metric, higher", [
    ("val/val/loss", False), ("val/code/ppl", False), ("loss", False), ("loss_avg", False),
    ("harness/hellaswag/acc", True), ("harness/hellaswag/acc_norm,none", True),
    ("harness/gsm8k/exact_match,strict-match", True), ("harness/wikitext/word_perplexity", False),
    ("harness/wikitext/bits_per_byte", False), ("harness/lambada/perplexity", False), ("harness/cola/mcc", True),
    ("harness/wmt/ter", False), ("harness/squad/f1", True), ("harness/mine/my_score", True),
    ("harness/mine/held_out_loss", False),
])
def test_the_direction_comes_from_the_metric_name(metric: str, higher: bool) -> None:
    assert known_direction(metric) is higher
    assert ranking(metric, "checkpoint.keep_best") == Ranking(metric, higher)


@pytest.mark.parametrize("spec, words", [
    ("harness/mine/novelty", "whether a higher or a lower novelty is better is not known"),
    ("harness/t/acc_stderr", "a standard error is no measure of quality: name the metric itself, harness/t/acc"),
    ("harness/t/acc:up", "`:up` is no direction: end the metric with :max"),
    ("", "names no metric"),
])
def test_a_metric_of_unknown_direction_is_refused_naming_the_fix(spec: str, words: str) -> None:
    with pytest.raises(ConfigError, match="checkpoint.keep_best") as err:
        ranking(spec, "checkpoint.keep_best")
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_a_suffix_says_the_direction_of_any_metric() -> None:
    assert ranking("harness/mine/novelty:max", "k") == Ranking("harness/mine/novelty", True)
    assert ranking("harness/mine/acc:min", "k") == Ranking("harness/mine/acc", False)


def test_a_value_that_is_not_finite_is_never_best_and_a_tie_goes_to_the_earliest() -> None:
    lower, higher = Ranking("val/val/loss", False), Ranking("harness/t/acc", True)
    assert lower.best({10: 3.0, 20: math.nan, 30: -math.inf, 40: 2.5, 50: 2.5}) == 40
    assert higher.best({10: 0.5, 20: math.inf, 30: 0.7, 40: 0.7}) == 30
    assert lower.best({10: math.nan}) is None and lower.best({}) is None


def fake_run(run_dir: Path, steps: tuple[int, ...], keep_best: str | None = None, **losses: dict[int, float]) -> Path:
    """Complete checkpoints at `steps`; `losses[KEY]`: {step: value} as metrics.jsonl rows (validation rows)."""
    for step in steps:
        path = layout.step_dir(run_dir, step)
        path.mkdir(parents=True)
        layout.write_marker(path, step=step)
    rows: dict[int, dict[str, Any]] = {}
    for key, by_step in losses.items():
        for step, value in by_step.items():
            rows.setdefault(step, {"step": step})[key.replace("__", "/")] = value
    (run_dir / "metrics.jsonl").write_text("".join(metrics_file.encode_row(rows[s]) + "\n" for s in sorted(rows)))
    config = {**{section: {} for section in REQUIRED}, "run": {"name": run_dir.name},
              "trainer": {"max_steps": max(steps)}, "checkpoint": {"keep_last": 1, "keep_every": 0,
                                                                   "keep_best": keep_best}}
    OmegaConf.save(OmegaConf.create(config), run_dir / "config.yaml")
    return run_dir


def test_the_best_checkpoint_is_read_from_every_measurement(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "r", (10, 20, 30), val__val__loss={10: 3.0, 20: 2.0, 30: 2.5, 40: 1.0})
    lower = Ranking("val/val/loss", False)
    best = measured.best_checkpoint(run, lower)
    assert best is not None and (best.checkpoint.step, best.value, best.kept, best.measured) == (20, 2.0, 3, 4)
    # An evaluation job's result arrives later and wins over the row of the same step.
    eval_results.write_result(run, 30, {"val/val/loss": 1.5})
    assert measured.best_checkpoint(run, lower).checkpoint.step == 30  # type: ignore[union-attr]
    (layout.step_dir(run, 30) / layout.MARKER).unlink()  # an incomplete checkpoint is no candidate
    assert measured.best_checkpoint(run, lower).checkpoint.step == 20  # type: ignore[union-attr]
    assert measured.best_checkpoint(run, Ranking("harness/t/acc", True)) is None


def test_retention_keeps_the_best_beside_keep_last_and_waits_for_pending_evaluations(tmp_path: Path) -> None:
    from train.checkpoints.retention import doomed_checkpoints

    run = fake_run(tmp_path / "r", (10, 20, 30, 40), val__val__loss={10: 3.0, 20: 2.0, 30: 2.2})
    cfg = OmegaConf.create({"keep_last": 1, "keep_every": 0, "keep_best": "val/val/loss"})
    eval_results.mark_pending(run, 40)  # step 40's evaluation job has not written its result yet
    assert [c.step for c in doomed_checkpoints(run, cfg)] == [10, 30]
    # Its result comes (the job writes it, clears the marker, then applies retention): 40 is the new best, 20 goes.
    eval_results.write_result(run, 40, {"val/val/loss": 1.9})
    eval_results.clear_pending(run, 40)
    assert [c.step for c in doomed_checkpoints(run, cfg)] == [10, 20, 30]
    # Higher-is-better, and without keep_best (a config written before the key) only keep_last counts.
    scores = OmegaConf.create({"keep_last": 1, "keep_every": 0, "keep_best": "harness/t/acc"})
    eval_results.write_result(run, 20, {"harness/t/acc": 0.9})
    eval_results.write_result(run, 30, {"harness/t/acc": 0.4})
    assert [c.step for c in doomed_checkpoints(run, scores)] == [10, 30]
    assert [c.step for c in doomed_checkpoints(run, OmegaConf.create({"keep_last": 1, "keep_every": 0}))] == [10, 20,
                                                                                                            30]


def test_best_picks_the_measured_best_and_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(tmp_path / "r", (10, 20, 30), keep_best="harness/t/acc",
                   val__val__loss={10: 2.0, 20: 3.0, 30: 4.0}, harness__t__acc={10: 0.2, 20: 0.8, 30: 0.5})
    assert pick_checkpoint(run, None, best=True).step == 20  # the run's keep_best, not the first validation loss
    assert capsys.readouterr().err == ("best checkpoint by the run's checkpoint.keep_best: step 20, harness/t/acc "
                                       "0.8000 (higher is better; the best of 3 measured checkpoints)\n")
    # Six steps measured, three of them kept (issue 36, item 6: it said "the best of 3 measured checkpoints").
    pruned = fake_run(tmp_path / "k", (20, 40, 60), keep_best="val/val/loss",
                      val__val__loss={10: 5.0, 20: 2.0, 30: 3.0, 40: 2.5, 50: 2.6, 60: 2.7})
    assert pick_checkpoint(pruned, None, best=True).step == 20
    assert capsys.readouterr().err.endswith("val/val/loss 2.0000 (lower is better; the best of the 3 kept "
                                            "checkpoints; 6 steps measured)\n")
    # Two kept, one of them measured (it said "the best of the 1 kept checkpoint; 2 steps measured").
    half = fake_run(tmp_path / "h", (15, 20), keep_best="val/val/loss", val__val__loss={10: 5.0, 20: 4.0})
    assert pick_checkpoint(half, None, best=True).step == 20
    assert capsys.readouterr().err.endswith("val/val/loss 4.0000 (lower is better; the best of the 1 measured of 2 "
                                            "kept checkpoints; 2 steps measured)\n")
    plain = fake_run(tmp_path / "p", (10, 20, 30), val__val__loss={10: 2.0, 20: 3.0, 30: 4.0})
    assert pick_checkpoint(plain, None, best=True).step == 10  # no keep_best: the first validation set's loss
    assert "by the first validation set's loss: step 10, val/val/loss 2.0000" in capsys.readouterr().err


def test_evaluate_takes_best_as_export_and_sample_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`launcher.evaluate RUN --best` (issue 30, item 5) was refused as an unrecognized argument."""
    from launcher.evaluate import build_parser, checkpoints

    run = fake_run(tmp_path / "r", (10, 20, 30), keep_best="val/val/loss", val__val__loss={10: 3.0, 20: 2.0, 30: 2.5})
    notes: list[str] = []
    run_dir, chosen = checkpoints(build_parser().parse_args([str(run), "--best"]), notes)
    assert (run_dir, [c.step for c in chosen]) == (run, [20])
    # said by the command once its other checks pass (a refusal stays one line)
    assert len(notes) == 1 and "step 20, val/val/loss 2.0000" in notes[0] and capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([str(run), "--best", "--all"])
    assert stop.value.code == 2
    assert "argument --all: not allowed with argument --best" in capsys.readouterr().err


@pytest.mark.parametrize("losses, words", [
    ({}, "has no validation loss (checkpoint.keep_best unset, no eval.every): pick one with --step N"),
    ({"val__val__loss": {5: 1.0}}, "none of the complete checkpoints of"),
])
def test_best_without_a_measured_checkpoint_is_one_line(tmp_path: Path, losses: dict[str, dict[int, float]],
                                                        words: str) -> None:
    run = fake_run(tmp_path / "r", (10, 20), **losses)
    with pytest.raises(ConfigError) as err:
        pick_checkpoint(run, None, best=True)
    assert words in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--best and the checkpoint of step 10 both choose one"):
        pick_checkpoint(run, 10, best=True)


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("args, words", [
    (["checkpoint.keep_best=val/val/loss"], "checkpoint.keep_best=val/val/loss needs the checkpoints measured: "
                                            "validate in the loop with eval.every=N"),
    (["checkpoint.keep_best=val/nope/loss", "eval.every=10"], "the run measures val/val/loss (and each set's /ppl): "
                                                              "name one of them"),
    (["checkpoint.keep_best=val/val/acc", "eval.every=10"], "the run measures val/val/loss"),
    (["checkpoint.keep_best=loss", "eval.every=10"], "keep the best by what evaluation measures: val/NAME/loss"),
    (["checkpoint.keep_best=harness/mytask/acc", "eval.every=10"], "harness/TASK/METRIC names a task of "
                                                                   "eval.harness.tasks (none)"),
    (["checkpoint.keep_best=val/val/loss", "eval.every=7", "trainer.ckpt_every=10"],
     "eval.every=7 does not measure every checkpoint (trainer.ckpt_every=10): set eval.every to a divisor of 10"),
    (["checkpoint.keep_best=val/val/loss:up", "eval.every=10"], "`:up` is no direction"),
])
def test_a_metric_the_run_never_measures_is_refused_at_launch(tmp_path: Path, args: list[str], words: str) -> None:
    root = tmp_path / "runs dir's"
    root.mkdir()
    out = run_module("launcher", [*args, "trainer.max_steps=20", f"run.root={hq(root)}"], cwd=tmp_path,
                     env=launcher_env(), timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
    assert words in out.stderr
    assert snapshot(root) == []


def test_a_measured_metric_is_accepted(tmp_path: Path) -> None:
    from launcher.compose import compose_and_plan

    cfg, _ = compose_and_plan(["checkpoint.keep_best=val/val/ppl", "eval.every=5", "trainer.ckpt_every=10",
                               f"run.root={tmp_path}"])
    assert cfg.checkpoint.keep_best == "val/val/ppl"
