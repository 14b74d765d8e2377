"""What the stability checks keep between steps survives a checkpoint (issue 22 follow-up): the spike rule's window,
the run of skipped steps, the data positions a rollback reaches back to, the counts; and fp16's loss-scaler skips
are counted, not trouble, until the scale has collapsed. On one process, with fakes for the strategy and the
checkpoint manager (tests/dist/test_stability_resume.py does it end to end)."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from train.distributed import DistEnv
from train.stability.monitor import NOTHING, ROLLBACK, STOP, Monitor
from train.stability.runner import STATE_KEY, Stability
from train.stability.verdict import MIN_SCALE, NONFINITE, SCALER, SPIKE, SpikeRule, StepVerdict

CPU = torch.device("cpu")
# Losses that drift down with some noise, a spike at index 12, more noise after.
LOSSES = [5.0 - 0.05 * i + 0.02 * ((i * 7) % 5) for i in range(20)]
LOSSES[12] = 40.0


def _through_a_file(state: Any) -> Any:
    """As trainer_state.pt carries it: torch.save, then torch.load as train/checkpoints/manager.py does."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _feed(rule: SpikeRule, losses: list[float]) -> list[float]:
    verdict = StepVerdict(rule, 1, CPU)
    return [float(verdict(torch.tensor(v), torch.tensor(1.0 + 0.01 * i))) for i, v in enumerate(losses)]


def test_a_loaded_window_decides_bitwise_as_the_rule_that_saved_it() -> None:
    whole = SpikeRule(sigma=6.0, window=8, device=CPU)
    _feed(whole, LOSSES[:10])  # the ring has wrapped: the slot order matters for bitwise equal sums
    resumed = SpikeRule(sigma=6.0, window=8, device=CPU)
    assert resumed.load_state_dict(_through_a_file(whole.state_dict())) is None  # taken exactly
    fresh = SpikeRule(sigma=6.0, window=8, device=CPU)
    codes = {name: _feed(rule, LOSSES[10:]) for name, rule in (("whole", whole), ("resumed", resumed),
                                                               ("fresh", fresh))}
    assert codes["whole"][2] == SPIKE and codes["resumed"] == codes["whole"]
    assert codes["fresh"][2] == 0  # what a resume did before: an empty window lets the spike through
    assert torch.equal(resumed.values, whole.values) and torch.equal(resumed.weights, whole.weights)
    assert resumed.calls == whole.calls


def test_a_window_saved_at_another_size_keeps_its_newest_values_oldest_first() -> None:
    saved = SpikeRule(sigma=6.0, window=8, device=CPU)
    _feed(saved, [float(v) for v in range(1, 12)])  # 11 calls into 8 slots: 4..11 held, 9..11 in slots 0..2
    smaller = SpikeRule(sigma=6.0, window=4, device=CPU)
    note = smaller.load_state_dict(saved.state_dict())
    assert note is not None and "8 slots" in note and "4 now" in note
    assert smaller.values[:, 0].tolist() == [8.0, 9.0, 10.0, 11.0] and smaller.calls == 4
    larger = SpikeRule(sigma=6.0, window=16, device=CPU)
    larger.load_state_dict(saved.state_dict())
    assert larger.values[:8, 0].tolist() == [float(v) for v in range(4, 12)] and float(larger.weights.sum()) == 8


def test_a_run_of_skipped_steps_goes_on_across_a_save() -> None:
    before = Monitor("skip", skip_limit=3, max_rollbacks=3, rollbacks_done=0)
    for step, code in [(1, 0), (2, SPIKE), (3, 0), (4, NONFINITE), (5, NONFINITE)]:
        before.observe(step, code)
    assert before.action() == NOTHING
    after = Monitor("skip", skip_limit=3, max_rollbacks=3, rollbacks_done=0)
    after.load_state_dict(_through_a_file(before.state_dict()))
    after.observe(6, NONFINITE)
    assert after.action() == ROLLBACK and after.trouble(ROLLBACK).bad_steps == [4, 5, 6]
    assert (after.nonfinite, after.spikes) == (3, 1)  # counted on from the checkpoint's counts


def test_fp16_overflows_are_the_scalers_until_its_scale_has_collapsed() -> None:
    scaler = SimpleNamespace(_scale=torch.full((1,), 2.0))
    verdict = StepVerdict(None, 1, CPU, scaler=scaler)
    assert float(verdict(torch.tensor(3.0), torch.tensor(1.0))) == 0
    assert float(verdict(torch.tensor(3.0), torch.tensor(float("inf")))) == SCALER
    scaler._scale.fill_(MIN_SCALE)
    assert float(verdict(torch.tensor(3.0), torch.tensor(float("nan")))) == SCALER + NONFINITE
    assert float(verdict(torch.tensor(3.0), torch.tensor(1.0))) == 0  # a finite step at a low scale is fine


@pytest.mark.parametrize("policy", ["skip", "rollback", "stop"])
def test_scaler_skips_are_counted_and_are_no_trouble_but_a_collapsed_scale_is(policy: str) -> None:
    m = Monitor(policy, skip_limit=2, max_rollbacks=3, rollbacks_done=0)
    for step in range(1, 6):  # a routine start: five overflows in a row while the scale comes down
        m.observe(step, SCALER)
    assert m.action() == NOTHING and m.scaler_skipped == 5 and m.nonfinite == 0 and m.run == []
    assert [code for _, code in m.take_unreported()] == [SCALER] * 5  # each one in events.jsonl
    m.observe(6, SCALER + NONFINITE)
    m.observe(7, SCALER + NONFINITE)
    wanted = {"skip": ROLLBACK, "rollback": ROLLBACK, "stop": STOP}[policy]
    assert m.action() == wanted and m.trouble(wanted).bad_steps == [6, 7] and m.scaler_skipped == 7


class _Ckpt:
    def __init__(self, loaded: dict[str, Any]) -> None:
        self.loaded, self.verified, self.extra_state = loaded, None, dict


def _stability(tmp_path: Path, loaded: dict[str, Any], scaler: Any = None, **stability: Any) -> Stability:
    cfg = OmegaConf.create({
        "stability": {"enabled": True, "nonfinite": "skip", "skip_limit": 2, "max_rollbacks": 3,
                      "skip_margin_steps": 1, "spike_sigma": 6.0, "spike_window": 8, "replica_check_every": 0,
                      **stability},
        "strategy": {"name": "ddp", "backend": "torch"}, "optim": {"z_loss": 0.0, "lr": 1e-3},
        "run": {"name": "r"}})
    env = DistEnv(0, 0, 1, 1, "localhost", 0, "single", "n1")
    model = torch.nn.Linear(2, 2)
    strategy = SimpleNamespace(checkpoint_format="dcp", scaler=scaler, replica_set=lambda: ((), []),
                               replica_note=lambda: "", model=model, optimizer=torch.optim.SGD(model.parameters()))
    return Stability(cfg, env, CPU, tmp_path, strategy, _Ckpt(loaded), global_batch=16)


def _train(s: Stability, steps: range, codes: dict[int, float] | None = None) -> None:
    """The loop's calls per step: the position, the verdict on a loss and norm, the checks after the update."""
    for step in steps:
        s.step_start(step, 16 * (step - 1))
        loss = LOSSES[step % len(LOSSES)] if codes is None or step not in codes else codes[step]
        judged = s.check(torch.tensor(loss), step)
        assert judged is not None
        judged(torch.tensor(1.0))
        s.replicas_agree(step)


def test_a_resumed_stability_state_is_what_the_save_held_and_keeps_the_positions_a_rollback_needs(
        tmp_path: Path) -> None:
    before = _stability(tmp_path, {})
    assert before.ckpt.extra_state == before.state_dict  # the checkpoint manager asks it at each save
    _train(before, range(1, 11), {10: float("nan")})
    assert before.before_save() == NOTHING  # run [10]: one of skip_limit 2
    saved = _through_a_file({"step": 10, **before.state_dict()})
    # skip_limit 2 and margin 1: a run [10, 11] reaches back to step 9, the rollback's samples from step 9's position.
    assert [s for s, _ in saved[STATE_KEY]["starts"]] == [8, 9, 10]
    after = _stability(tmp_path, saved)
    assert after.monitor.run == [10] and after.starts == {8: 112, 9: 128, 10: 144}
    assert after.verdict is not None and before.verdict is not None
    assert torch.equal(after.verdict.spike.values, before.verdict.spike.values)  # type: ignore[union-attr]
    assert after.verdict.spike.calls == 10  # type: ignore[union-attr]


def test_a_checkpoint_without_stability_state_starts_it_empty_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slurmtrain"):
        old = _stability(tmp_path, {"step": 40, "samples": 640})
    assert old.monitor.run == [] and old.starts == {} and old.verdict is not None
    assert old.verdict.spike is not None and old.verdict.spike.calls == 0
    lines = [r.getMessage() for r in caplog.records if "checkpoint step 40" in r.getMessage()]
    assert len(lines) == 1 and "older slurmtrain" in lines[0] and "window starts empty" in lines[0]
    assert "until it holds 4 values" in lines[0]


def test_fp16_rows_carry_the_scaler_skips(tmp_path: Path) -> None:
    scaler = SimpleNamespace(_scale=torch.full((1,), 1024.0))
    s = _stability(tmp_path, {}, scaler=scaler, spike_sigma=0.0)
    for step in range(1, 4):
        s.step_start(step, 16 * (step - 1))
        judged = s.check(torch.tensor(2.0), step)
        assert judged is not None
        judged(torch.tensor(float("inf") if step < 3 else 1.0))
    fields = s.log_fields(3)
    assert fields == {"skipped_steps": 0, "spikes": 0, "scaler_skipped": 2}
    events = (tmp_path / "events.jsonl").read_text()
    assert events.count('"reason": "loss_scale"') == 2 and '"samples": [16, 32]' in events
    assert s.wanted() == NOTHING


def test_status_counts_the_loss_scalers_skips_apart_from_the_nonfinite_steps() -> None:
    from contract.rundir.events import stability_notes

    events = [{"kind": "skipped_step", "step": s, "reason": "loss_scale"} for s in (1, 2, 3)]
    events += [{"kind": "skipped_step", "step": 30, "reason": "nonfinite"}, {"kind": "finished", "step": 40}]
    assert stability_notes(events) == [
        "4 step(s) not applied (1 non-finite, 0 spikes, 3 fp16 overflows the loss scaler skipped), the last at step 30"]
