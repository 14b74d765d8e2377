"""Stability's parts on their own (issue 22): the on-device skip leaves AdamW untouched, the spike rule, the host's
decision, skipped sample ranges, z-loss against its closed form, goodput, and the launch-time refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from contract.errors import ConfigError
from contract.rules.stability_checks import check_stability
from contract.rundir.events import goodput, skipped_steps
from contract.rundir.skipped_samples import SkippedSamples
from train.optim import build_optimizer
from train.stability.monitor import NOTHING, ROLLBACK, STOP, Monitor
from train.stability.verdict import NONFINITE, SPIKE, SpikeRule, StepVerdict, apply_with_skip
from train.stability.z_loss import ZLoss

OPTIM = OmegaConf.create({"lr": 1e-2, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8})


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for state in optimizer.state.values():
        out += [v.detach().clone() for v in state.values()]
    return out


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, verdict: StepVerdict, poison: bool) -> float:
    loss = model(torch.ones(4, 8)).pow(2).mean()
    (loss * float("nan") if poison else loss).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    code = verdict(loss, norm)
    apply_with_skip(optimizer, code)
    optimizer.zero_grad(set_to_none=True)
    return float(code)


def test_a_nonfinite_step_leaves_weights_moments_and_adamw_step_count_as_they_were() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = build_optimizer(model, OPTIM)
    verdict = StepVerdict(None, 1, torch.device("cpu"), fp16=False)
    assert _step(model, optimizer, verdict, poison=False) == 0  # a real step first: moments are non-zero
    before = _snapshot(model, optimizer)
    assert _step(model, optimizer, verdict, poison=True) == NONFINITE
    after = _snapshot(model, optimizer)
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert _step(model, optimizer, verdict, poison=False) == 0  # and the next good step is applied
    assert not torch.equal(before[0], model.weight)
    assert all(float(s["step"]) == 2 for s in optimizer.state.values())  # the skipped one not counted


def test_the_spike_rule_flags_a_value_far_above_the_window_once_half_full() -> None:
    rule = SpikeRule(sigma=6.0, window=8, device=torch.device("cpu"))
    verdict = StepVerdict(rule, 1, torch.device("cpu"), fp16=False)
    assert float(verdict(torch.tensor(50.0), torch.tensor(1.0))) == 0  # fewer than window/2 values: no verdict
    rule.reset()
    codes = [float(verdict(torch.tensor(2.0 + 0.01 * (i % 3)), torch.tensor(1.0))) for i in range(4)]
    assert codes == [0, 0, 0, 0]
    assert float(verdict(torch.tensor(50.0), torch.tensor(1.0))) == SPIKE  # loss far above
    assert float(verdict(torch.tensor(2.0), torch.tensor(1.0))) == 0
    assert float(verdict(torch.tensor(2.0), torch.tensor(1e6))) == SPIKE  # or the gradient norm
    assert float(verdict(torch.tensor(float("nan")), torch.tensor(1.0))) == NONFINITE  # not a spike: worse
    assert float(verdict(torch.tensor(2.01), torch.tensor(1.0))) == 0  # the NaN did not poison the window


def test_the_monitor_rolls_back_after_skip_limit_in_a_row_then_stops_at_max_rollbacks() -> None:
    m = Monitor("skip", skip_limit=3, max_rollbacks=1, rollbacks_done=0)
    for step, code in [(1, 0), (2, NONFINITE), (3, 0), (4, NONFINITE), (5, SPIKE)]:
        m.observe(step, code)
    assert m.action() == NOTHING and (m.nonfinite, m.spikes) == (2, 1)
    m.observe(6, NONFINITE)
    m.observe(7, 0)  # a good step after the run does not undo it
    assert m.action() == ROLLBACK and m.trouble(ROLLBACK).bad_steps == [4, 5, 6]
    m.reset()
    m.rollbacks_done = 1
    assert m.action() == NOTHING
    for step in (8, 9, 10):
        m.observe(step, NONFINITE)
    trouble = m.trouble(m.action())
    assert trouble.action == STOP and "stability.max_rollbacks=1" in trouble.limit


@pytest.mark.parametrize(("policy", "wanted"), [("rollback", ROLLBACK), ("stop", STOP)])
def test_rollback_and_stop_act_on_the_first_nonfinite_step(policy: str, wanted: int) -> None:
    m = Monitor(policy, skip_limit=3, max_rollbacks=3, rollbacks_done=0)
    m.observe(5, SPIKE)
    assert m.action() == NOTHING  # a spike is only skipped
    m.observe(6, NONFINITE)
    assert m.action() == wanted and m.trouble(wanted).bad_steps == [6]


def test_skipped_ranges_move_a_step_past_them_and_persist(tmp_path: Path) -> None:
    skips = SkippedSamples(tmp_path)
    assert skips.start(96, 16) == 96 and skips.ranges == []
    skips.add_rollback([(96, 112)], "non-finite at step 7", write=True)
    assert skips.start(96, 16) == 112  # the step that would read them starts after them
    assert skips.start(88, 16) == 112  # a batch running into the range too (another global batch)
    assert skips.start(112, 16) == 112 and skips.start(80, 16) == 80
    assert list(skips.starts(80, 3, 16)) == [80, 112, 128]
    again = SkippedSamples(tmp_path)  # what a requeued attempt reads
    assert again.ranges == [(96, 112, "non-finite at step 7")] and again.rollbacks == 1


def test_z_loss_is_its_closed_form_and_leaves_ignored_targets_out() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 11) * 3
    targets = torch.tensor([1, 2, -100, 4, 5, -100])
    ce, z = ZLoss(1e-4).losses(logits, targets, ignore_index=-100)
    kept = targets != -100
    closed = 1e-4 * torch.logsumexp(logits[kept], dim=-1).pow(2).mean()
    assert torch.allclose(z, closed, rtol=1e-6, atol=0)
    assert torch.equal(ce, torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100))
    plain = 1e-4 * sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits[kept].tolist()) / 4
    assert float(z) == pytest.approx(plain, rel=1e-5)


def test_goodput_leaves_out_skipped_steps_and_counts_a_rolled_back_one_once() -> None:
    events = [{"kind": "skipped_step", "step": 4}, {"kind": "skipped_step", "step": 7},
              {"kind": "rollback", "step": 7, "to_step": 6}, {"kind": "skipped_step", "step": 9},
              {"kind": "finished", "step": 10, "started": 0.0, "ended": 20.0}]
    assert skipped_steps(events) == [4, 9]
    metrics = [{"step": s, "step_time_s": 1.0} for s in range(1, 11)]
    assert goodput(events, metrics) == pytest.approx((10 - 2) * 1.0 / 20.0)


def _cfg(**over: object) -> object:
    base = {"stability": {"enabled": True, "spike_sigma": 0.0}, "strategy": {"name": "ddp", "backend": "torch"},
            "precision": {"compute_dtype": "float32"}, "optim": {"z_loss": 0.0}, "parallel": {"pp": 1}}
    for key, value in over.items():
        section, leaf = key.split("__")
        base[section][leaf] = value  # type: ignore[index]
    return OmegaConf.create(base)


@pytest.mark.parametrize(("over", "fix"), [
    ({"stability__spike_sigma": 6.0, "strategy__backend": "deepspeed", "strategy__name": "zero2"},
     "set stability.spike_sigma=0"),
    ({"stability__spike_sigma": 6.0, "precision__compute_dtype": "float16"}, "use precision=bf16"),
    ({"optim__z_loss": 1e-4, "parallel__pp": 2}, "set optim.z_loss=0"),
])
def test_what_a_strategy_cannot_honour_is_refused_in_one_line(over: dict[str, object], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix) as err:
        check_stability(_cfg(**over))
    assert "\n" not in str(err.value)
    check_stability(_cfg())  # the defaults pass


def test_status_names_every_rollback_with_its_skipped_samples_and_counts_the_steps_not_applied() -> None:
    from contract.rundir.events import stability_notes

    events = [{"kind": "skipped_step", "step": 7, "reason": "nonfinite"},
              {"kind": "rollback", "step": 7, "to_step": 6, "reason": "non-finite gradient norm or loss at step 7",
               "skipped": [[96, 112]]},
              {"kind": "skipped_step", "step": 38, "reason": "spike"}, {"kind": "finished", "step": 40}]
    assert stability_notes(events) == [
        "rolled back from step 7 to step 6 (non-finite gradient norm or loss at step 7): samples [96, 112) skipped",
        "2 step(s) not applied (1 non-finite, 1 spikes), the last at step 38"]
    assert stability_notes([{"kind": "finished", "step": 40}]) == []
