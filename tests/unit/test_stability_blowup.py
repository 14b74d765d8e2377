"""Divergence handling that leads somewhere (issue 27, item 1): a checkpoint whose loss blew far above the run's start
or its best is never a rollback target nor "good" in the stop line; "start over" starts from the run's own initial
weights; the rate is cut as far as the loss blew up; one bad batch is resumed past, not trained again at half the
rate; launcher.status flags a loss far above the start. Fake loss histories on one process (the runner with fakes
for the strategy and the checkpoint manager); tests/dist/test_stability.py diverges a tiny model for real."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from contract.rules.blowup import LossHistory, far_above, lr_cut, reference
from contract.rundir import ckpt_layout as layout
from launcher import status
from launcher.observe.run_rows import loss_blown_since
from tests.unit.test_stability_state import _through_a_file
from tests.unit.test_status import write_run
from train.distributed import DistEnv
from train.stability.advice import diagnose
from train.stability.monitor import ROLLBACK, STOP
from train.stability.runner import Stability

CPU = torch.device("cpu")
VOCAB = 4096  # ln(4096) = 8.318: a random model's loss
# The run: optim.lr=10 on a 4096-token vocabulary, logged every 10 steps, saved every 10 steps.
BLOWN = {1: 8.32, 10: 797.0, 20: 703.0}
COMMAND = "cd /w && /usr/bin/python3 -m launcher run.root=/tmp/w run.name=d optim.lr=10 stability.nonfinite={}\n"


class _Ckpt:
    """The checkpoint manager as the runner and rollback use it: markers on disk, `latest` as the real one picks."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.loaded, self.verified, self.extra_state = run_dir, {}, None, dict
        self.env = SimpleNamespace(is_main=True)
        self.chosen: list[int] = []

    def wait(self) -> None:
        pass

    def latest(self, where: Any = None) -> layout.CheckpointDir | None:
        found = [c for c in layout.list_checkpoints(self.run_dir) if c.complete and (where is None or where(c.step))]
        return found[-1] if found else None

    def load(self, checkpoint: layout.CheckpointDir) -> dict[str, Any]:
        self.chosen.append(checkpoint.step)
        return {"step": checkpoint.step}


def _stability(run_dir: Path, nonfinite: str, command: str | None = None, **stability: Any) -> Stability:
    cfg = OmegaConf.create({
        "stability": {"enabled": True, "nonfinite": nonfinite, "skip_limit": 3, "max_rollbacks": 3,
                      "skip_margin_steps": 0, "spike_sigma": 0.0, "spike_window": 8, "replica_check_every": 0,
                      "blowup_margin": 2.3, **stability},
        "strategy": {"name": "ddp", "backend": "torch"}, "optim": {"z_loss": 0.0, "lr": 10.0},
        "model": {"vocab_size": VOCAB}, "run": {"name": "d"}, "trainer": {"max_steps": 40}})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text(command if command is not None else COMMAND.format(nonfinite))
    env = DistEnv(0, 0, 1, 1, "localhost", 0, "single", "n1")
    model = torch.nn.Linear(2, 2)
    strategy = SimpleNamespace(checkpoint_format="dcp", scaler=None, replica_set=lambda: ((), []),
                               replica_note=lambda: "", model=model, optimizer=torch.optim.SGD(model.parameters()))
    return Stability(cfg, env, CPU, run_dir, strategy, _Ckpt(run_dir), global_batch=8)


def _train(s: Stability, losses: dict[int, float], nonfinite: tuple[int, ...] = (),
           saves: tuple[int, ...] | None = None) -> None:
    """The loop's calls, step by step to the last one given: the verdict, a log row at each step given, a save
    (marker with its loss) at each of `saves` (default: each step given but the first and the non-finite ones)."""
    saves = tuple(s for s in losses if s > 1 and s not in nonfinite) if saves is None else saves
    for step in range(1, max(losses) + 1):
        s.step_start(step, 8 * (step - 1))
        judged = s.check(torch.tensor(losses.get(step, 1.0)), step)
        assert judged is not None
        judged(torch.tensor(float("nan") if step in nonfinite else 1.0))
        s.replicas_agree(step)
        if step in losses:
            s.log_fields(step, losses[step])
        if step in saves:
            _save(s, step)


def _save(s: Stability, step: int) -> None:
    assert s.before_save() == 0
    path = layout.step_dir(s.run_dir, step)
    path.mkdir(parents=True)
    layout.write_marker(path, step=step, **s.ckpt.losses_at(step))


def _stop_line(s: Stability, step: int, capsys: pytest.CaptureFixture[str]) -> str:
    outcome = s.recover(STOP, step)
    assert outcome.exit_code == 76 and outcome.kind == "diverged"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    return lines[0]


def _command(line: str, marker: str) -> list[str]:
    """The advised command: after `marker`, to the end or the explanation in brackets."""
    return shlex.split(line.split(marker, 1)[1].split(" (a new run")[0].split(" (or stability")[0])


def _value(args: list[str], key: str) -> str | None:
    found = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key]
    assert len(found) <= 1, f"{key} given twice: {args}"
    return found[0] if found else None


# -- the rule ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [256, 4096, 128256])
def test_far_above_is_a_margin_in_nats_over_a_reference_capped_at_a_random_models_loss(vocab: int) -> None:
    start = math.log(vocab)  # a random model's first loss, whatever the vocabulary
    ref = reference(start + 0.3, vocab)  # a start a little above ln(vocab): capped there
    assert ref == pytest.approx(start)
    assert not far_above(start + 2.2, ref, 2.3) and far_above(start + 2.4, ref, 2.3)
    assert far_above(float("nan"), ref, 2.3) and not far_above(start + 100, None, 2.3)
    assert reference(None, vocab) == pytest.approx(start) and reference(None, None) is None
    assert reference(605.0, vocab) == pytest.approx(start)  # weights that start blown are judged from ln(vocab)
    assert lr_cut(start * 96, start) == 100 and lr_cut(start + 2.4, start) == 10 and lr_cut(1e30, start) == 10**6


def test_the_loss_history_keeps_the_first_finite_loss_as_start_and_survives_a_resume(tmp_path: Path) -> None:
    before = _stability(tmp_path / "r", "skip")
    _train(before, {1: float("nan"), 2: 8.3, 3: 5.0, 10: 6.0})
    assert (before.losses.start, before.losses.best, before.losses.last) == (8.3, 5.0, 6.0)
    ckpt = _Ckpt(before.run_dir)
    ckpt.loaded = _through_a_file({"step": 10, **before.state_dict()})
    after = Stability(before.cfg, before.env, CPU, before.run_dir, before.strategy, ckpt, global_batch=8)
    assert after.losses == before.losses and after.losses.start_step == 2 and after.losses.best_step == 3


def test_each_save_records_the_loss_of_its_step_in_its_marker_even_between_log_steps(tmp_path: Path) -> None:
    s = _stability(tmp_path / "r", "skip")
    _train(s, {1: 8.3, 4: 6.0})
    s.step_start(5, 32)
    s.check(torch.tensor(5.5), 5)(torch.tensor(1.0))  # type: ignore[misc]
    s.replicas_agree(5)
    _save(s, 5)  # not a log step: the save reads the step's loss itself
    assert layout.marker_losses(layout.CheckpointDir(5, layout.step_dir(s.run_dir, 5))) == (5.5, 5.5)
    assert layout.marker_losses(layout.CheckpointDir(4, layout.step_dir(s.run_dir, 4))) == (6.0, 6.0)
    assert s.losses.last == 5.5 and s.losses.last_step == 5


# -- rollback targets and the stop line -----------------------------------------------------------------------------

def test_a_loss_blown_up_over_many_steps_is_no_rollback_target_and_starting_over_cuts_the_rate_100x(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's run: 8.32 -> 797 (step 10) -> 703 (step 20), then three steps in a row not applied."""
    s = _stability(tmp_path / "d", "skip")
    _train(s, {**BLOWN, 23: 650.0}, nonfinite=(21, 22, 23))
    assert s.wanted(drain=True) == ROLLBACK
    line_or_state = s.recover(ROLLBACK, 23)
    assert s.ckpt.chosen == [], "rolled back to a checkpoint whose loss had blown up"  # type: ignore[attr-defined]
    assert line_or_state.kind == "diverged"
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")][0]
    assert "last good checkpoint" not in line and "steps 10, 20" in line and "far above its start" in line
    args = _command(line, "with a lower learning rate (100x lower): ")
    assert args[:3] == ["cd", "/w", "&&"]  # the launch directory kept, the rest of the command as it was
    assert _value(args, "optim.lr") == "0.1" and _value(args, "run.overwrite") == "true"
    assert _value(args, "run.name") == "d" and _value(args, "model.init_from") is None  # its own random start


def test_a_rollback_skips_blown_checkpoints_for_the_newest_one_before_the_blow_up(tmp_path: Path) -> None:
    s = _stability(tmp_path / "d", "rollback")
    _train(s, {1: 8.3, 10: 4.0, 20: 3.0, 30: 9.0, 40: 40.0, 41: 38.0}, nonfinite=(41,))
    s.recover(ROLLBACK, 41)
    assert s.ckpt.chosen == [20]  # type: ignore[attr-defined]


def test_an_early_checkpoint_is_judged_by_the_best_of_its_time_not_by_the_best_reached_later(tmp_path: Path) -> None:
    s = _stability(tmp_path / "d", "rollback")
    # Saved at step 10 (6.0, its best so far); the run learns on to 3.0, then a non-finite step.
    _train(s, {1: 8.3, 10: 6.0, 15: 3.0, 16: 3.1}, nonfinite=(16,), saves=(10,))
    s.recover(ROLLBACK, 16)
    assert s.ckpt.chosen == [10]  # type: ignore[attr-defined]


def test_a_loss_that_climbed_far_above_its_best_goes_on_from_the_checkpoint_before_at_half_the_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stability(tmp_path / "d", "stop")
    _train(s, {1: 8.3, 10: 4.0, 20: 3.0, 30: 4.5, 40: 6.0, 41: 6.1}, nonfinite=(41,))
    line = _stop_line(s, 41, capsys)
    assert "climbed far above the best it reached (6.1 at step 41 against 3 at step 20" in line
    assert "last good checkpoint (before the trouble) is step 30" in line and "not step 40" in line
    args = _command(line, "with a lower learning rate (half): ")
    assert _value(args, "optim.lr") == "5" and _value(args, "model.init_from") == str(layout.step_dir(s.run_dir, 30))


def test_one_bad_batch_after_healthy_steps_resumes_past_it_at_the_same_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stability(tmp_path / "d", "stop")
    _train(s, {1: 8.3, 10: 6.0, 20: 5.0, 21: 5.1}, nonfinite=(21,))
    line = _stop_line(s, 21, capsys)
    assert "one bad batch" in line and "lower learning rate" not in line
    args = _command(line, "at the same rate: ")
    # The same run (same name, no overwrite, no new weights), resumed from step 20 with the step not applied.
    assert _value(args, "stability.nonfinite") == "skip" and _value(args, "run.name") == "d"
    assert _value(args, "optim.lr") == "10" and _value(args, "run.overwrite") is None
    assert _value(args, "model.init_from") is None and "from the last checkpoint (step 20" in line


def test_several_bad_steps_or_an_exhausted_rollback_budget_are_not_one_bad_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stability(tmp_path / "d", "stop")
    _train(s, {1: 8.3, 10: 6.0, 20: 5.0, 22: 5.1}, nonfinite=(21, 22))
    line = _stop_line(s, 22, capsys)
    assert "one bad batch" not in line and "with a lower learning rate (half): " in line


def test_a_fine_tuning_run_that_blew_up_starts_over_from_its_own_init_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = "python -m launcher run.name=d optim.lr=10 model.init_from=/w/base stability.nonfinite=stop\n"
    s = _stability(tmp_path / "d", "stop", command=command)
    _train(s, {1: 2.1, 10: 30.0, 11: 31.0}, nonfinite=(11,))  # its one checkpoint (step 10) blew up
    line = _stop_line(s, 11, capsys)
    assert "far above its start, 2.1 at step 1" in line and "no good checkpoint from before the trouble" in line
    assert "(step 10: its loss is far above the best)" in line
    args = _command(line, "with a lower learning rate (10x lower): ")
    assert _value(args, "model.init_from") == "/w/base" and _value(args, "optim.lr") == "1"
    assert _value(args, "run.overwrite") == "true" and "weights it started from" in line
    # With a checkpoint from before the blow-up: a new run from it, not from the blown step 20.
    s = _stability(tmp_path / "e", "stop", command=command)
    _train(s, {1: 2.1, 10: 1.9, 20: 30.0, 21: 31.0}, nonfinite=(21,))
    line = _stop_line(s, 21, capsys)
    args = _command(line, "with a lower learning rate (10x lower): ")
    assert _value(args, "model.init_from") == str(layout.step_dir(s.run_dir, 10)) and "not step 20" in line


def test_a_run_started_from_a_diverged_runs_weights_starts_over_from_random_weights(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's second round: a run from diverge/checkpoints/step_20 starts at 605; its own start over must not
    carry those weights again."""
    command = ("python -m launcher run.name=d-lr5 optim.lr=5 model.init_from=/r/diverge/checkpoints/step_20 "
               "stability.nonfinite=stop\n")
    s = _stability(tmp_path / "d-lr5", "stop", command=command)
    _train(s, {1: 605.0, 10: 580.0, 20: 590.0, 21: 600.0}, nonfinite=(21,))
    line = _stop_line(s, 21, capsys)
    assert "far above a random model's loss, ln(4096) = 8.318" in line and "random weights" in line
    args = _command(line, "with a lower learning rate (100x lower): ")
    assert _value(args, "model.init_from") == "null" and _value(args, "run.overwrite") == "true"


# -- issue 27's trial (second round): a collapsed model, dead weights, a run from them ----------------------------

UNIFORM = math.log(VOCAB)  # a collapsed model's loss: every next token equally likely


def _go_on(s: Stability, steps: range, nonfinite: tuple[int, ...]) -> None:
    """The loop's calls for `steps` after a rollback (no log rows, no saves)."""
    for step in steps:
        s.step_start(step, 8 * (step - 1))
        s.check(torch.tensor(1.0), step)(torch.tensor(float("nan") if step in nonfinite else 1.0))  # type: ignore[misc]
        s.replicas_agree(step)


def test_a_collapsed_checkpoint_is_no_rollback_target_and_starting_over_cuts_the_rate_10x(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """optim.lr=1e4: the loss goes to ln(vocab) by step 2 (never "far above" the start, 8.25), steps 5-7 not
    finite. Steps 2 and 4 hold a collapsed model: no rollback to them, and the advice starts over 10x lower."""
    s = _stability(tmp_path / "d", "skip")
    _train(s, {1: 8.25, 2: UNIFORM, 4: UNIFORM, 7: UNIFORM}, nonfinite=(5, 6, 7), saves=(2, 4))
    outcome = s.recover(ROLLBACK, 7)
    assert s.ckpt.chosen == [] and outcome.kind == "diverged"  # type: ignore[attr-defined]
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")][0]
    assert "last good checkpoint" not in line and "the model collapsed" in line
    assert "steps 2, 4: its loss sits at a random model's" in line
    args = _command(line, "with a lower learning rate (10x lower): ")
    assert _value(args, "optim.lr") == "1" and _value(args, "model.init_from") is None


def test_a_collapsed_checkpoint_is_known_by_its_vanishing_gradient_norm_too(tmp_path: Path) -> None:
    s = _stability(tmp_path / "d", "rollback")
    _train(s, {1: UNIFORM, 2: 6.0}, saves=(2,))
    s.step_start(3, 16)
    s.check(torch.tensor(UNIFORM), 3)(torch.tensor(0.0))  # type: ignore[misc]
    s.replicas_agree(3)
    _save(s, 3)  # at ln(vocab) after 6.0, and no gradient left
    assert layout.marker(layout.CheckpointDir(3, layout.step_dir(s.run_dir, 3)))["grad_norm"] == 0.0
    assert s.targets.why_not(3) and s.targets.why_not(2) is None
    from contract.rules.blowup import collapsed
    assert collapsed(UNIFORM, UNIFORM, VOCAB, grad_norm=0.0) and not collapsed(UNIFORM, UNIFORM, VOCAB, 0.5)
    assert not collapsed(UNIFORM - 0.08, 8.0, VOCAB)  # a random model's own start, a little below ln(vocab)


def test_a_checkpoint_training_fails_from_at_once_after_a_rollback_is_not_rolled_back_to_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stability(tmp_path / "d", "skip")
    _train(s, {1: 8.3, 2: 7.0, 4: 6.5, 7: 6.5}, nonfinite=(5, 6, 7), saves=(2, 4))
    s.recover(ROLLBACK, 7)
    _go_on(s, range(5, 8), nonfinite=(5, 6, 7))  # from step 4 again: non-finite at once
    assert s.wanted(drain=True) == ROLLBACK
    s.recover(ROLLBACK, 7)
    assert s.ckpt.chosen == [4, 2]  # type: ignore[attr-defined]
    _go_on(s, range(3, 6), nonfinite=(3, 4, 5))  # and from step 2 too: nothing good is left
    outcome = s.recover(ROLLBACK, 5)
    assert outcome.kind == "diverged" and s.ckpt.chosen == [4, 2]  # type: ignore[attr-defined]
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")][0]
    assert "last good checkpoint" not in line and "non-finite at once from it after a rollback" in line
    assert _value(_command(line, "with a lower learning rate (10x lower): "), "optim.lr") == "1"


def test_a_run_from_init_from_that_fails_at_its_first_step_says_so_and_starts_from_random_weights(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trial's second round: init_from a collapsed run's step_4 at half the rate fails at steps 1-3; its own
    advice carried the same weights again, and kept the name div2-lr5000 for a rate of 2500."""
    init = "/r/div2/checkpoints/step_4"
    command = f"python -m launcher run.name=div2-lr5000 optim.lr=5000 model.init_from={init} stability.nonfinite=skip\n"
    s = _stability(tmp_path / "div2-lr5000", "skip", command=command)
    s.cfg.model.init_from, s.cfg.optim.lr, s.cfg.run.name = init, 5000.0, "div2-lr5000"
    _train(s, {1: UNIFORM, 3: UNIFORM}, nonfinite=(1, 2, 3), saves=(2,))
    outcome = s.recover(ROLLBACK, 3)
    assert outcome.kind == "diverged"
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")][0]
    assert f"non-finite at its first step from the weights it started from (model.init_from={init})" in line
    args = _command(line, "with a lower learning rate (10x lower): ")
    assert _value(args, "model.init_from") == "null" and _value(args, "optim.lr") == "500"
    assert _value(args, "run.name") == "div2-lr500"  # the name follows the rate


def test_a_renamed_run_going_on_from_a_good_checkpoint_is_renamed_for_the_new_rate_once() -> None:
    from train.stability.advice import renamed
    assert renamed("div2", "5000") == "div2-lr5000" and renamed("div2-lr5000", "2500") == "div2-lr2500"
    assert renamed("a-lr5e-05", "2.5e-05") == "a-lr2.5e-05" and renamed("lr-sweep", "1") == "lr-sweep-lr1"


def test_a_finite_blow_up_that_trains_on_to_the_end_is_warned_of_when_it_starts_and_at_the_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """optim.lr=10: 5.47 -> 813, finite to the end: "finished" alone said nothing of it."""
    s = _stability(tmp_path / "d", "skip")
    with caplog.at_level("WARNING"):
        _train(s, {1: 5.47, 10: 813.0, 20: 703.0, 30: 600.0, 40: 39.0}, saves=())
    said = [r.getMessage() for r in caplog.records if "far above its start" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith("step 10: the loss (813) went far above its start (5.47 at step 1")
    assert said[1].startswith("the run ends with its loss far above its start since step 10 (39 at step 40")
    assert "optim.lr=1 (10x lower)" in said[1]
    caplog.clear()
    healthy = _stability(tmp_path / "e", "skip")
    with caplog.at_level("WARNING"):
        _train(healthy, {1: 5.47, 10: 4.0, 20: 7.7, 40: 3.0}, saves=())  # 7.7: within the margin
    assert not [r for r in caplog.records if "far above" in r.getMessage()]


def test_the_diagnosis_names_each_cause() -> None:
    def history(losses: dict[int, float]) -> LossHistory:
        h = LossHistory()
        for step, loss in losses.items():
            h.observe(step, loss)
        return h

    blew = diagnose(history(BLOWN), VOCAB, 2.3, one_step=True)
    assert (blew.kind, blew.cut, blew.init_blown) == ("blew_up", 100, False)
    assert diagnose(history({1: 8.3, 5: 3.0, 9: 5.4}), VOCAB, 2.3, one_step=True).kind == "climbed"
    assert diagnose(history({1: 8.3, 5: 3.0, 9: 5.2}), VOCAB, 2.3, one_step=True).kind == "one_batch"
    assert diagnose(history({1: 8.3, 5: 3.0, 9: 5.2}), VOCAB, 2.3, one_step=False).kind == "recurring"
    assert diagnose(LossHistory(), VOCAB, 2.3, one_step=False).kind == "recurring"
    # A larger margin: the same history is no blow-up (the key is honoured).
    assert diagnose(history(BLOWN), VOCAB, 1000.0, one_step=True).kind == "one_batch"


# -- launcher.status ---------------------------------------------------------------------------------------------

def test_status_flags_a_loss_far_above_the_runs_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blown, fine = tmp_path / "blown", tmp_path / "fine"
    write_run(blown, name="blown", max_steps=30, losses=[8.32, 797.0, 703.0])
    write_run(fine, name="fine", max_steps=30, losses=[8.32, 10.0, 7.0])
    for run_dir in (blown, fine):
        config = json.loads((run_dir / "config.yaml").read_text())
        (run_dir / "config.yaml").write_text(json.dumps({**config, "model": {"vocab_size": VOCAB}}))
    rows = {r["name"]: r for r in json.loads(status.main([str(tmp_path), "--json"]) == 0
                                              and capsys.readouterr().out)["rows"]}
    assert rows["blown"]["loss_blown_since"] == 20 and rows["fine"]["loss_blown_since"] is None
    cell = status.state_cell(status.Row(**rows["blown"]))
    assert "far above its start since step 20" in str(cell)


def test_status_says_the_checkpoints_after_the_last_good_one_are_an_abandoned_branch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trial: status showed `ckpt 6` (written inside the trouble) while the stop line named step 4 the last good
    one: the diverged end records both, and status says which is which."""
    from train.faults.recovery import end_of_attempt

    s = _stability(tmp_path / "d", "skip")
    _train(s, {1: 8.3, 2: 7.0, 4: 6.5, 7: 6.5}, nonfinite=(5, 6, 7), saves=(2, 4, 6))
    outcome = s.recover(STOP, 7)
    assert outcome.details == {"good_step": 4, "abandoned": [6]}
    end_of_attempt(s.run_dir, outcome, 7, 0.0)
    notes = events_notes(s.run_dir)
    assert any("diverged at step 7: the last good checkpoint is step 4; step 6 is from the abandoned branch" in n
               for n in notes), notes


def events_notes(run_dir: Path) -> list[str]:
    from contract.rundir.events import read_events, stability_notes
    return stability_notes(read_events(run_dir))


def test_status_judges_by_the_runs_own_margin_and_vocabulary() -> None:
    rows = [{"step": s, "loss": v} for s, v in ((10, 5.5), (20, 8.0), (30, float("nan")), (40, 10.0))]
    assert loss_blown_since(rows, {"model": {"vocab_size": 256}}) == 20  # 8.0 > 5.5 + 2.3; nan is blown too
    assert loss_blown_since(rows, {"model": {"vocab_size": 256}, "stability": {"blowup_margin": 4.0}}) == 30
    assert loss_blown_since(rows[:2], {"model": {"vocab_size": 256}, "stability": {"blowup_margin": 4.0}}) is None
    assert loss_blown_since(rows, {"model": {"vocab_size": 16}}) == 10  # 5.5 > ln(16) + 2.3 already
    assert loss_blown_since(rows, {}) == 20  # no vocabulary known: from the first loss alone
