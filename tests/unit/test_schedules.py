"""Learning-rate schedules: each one's closed form at chosen steps, today's cosine unchanged bit for bit, and a
resumed optimizer trains at the rate the new config's schedule gives for the step, whatever the old one saved."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from contract.rules.schedules import DECAY_SHAPES, SCHEDULES, Schedule
from train.optim import build_scheduler

T, W, M = 100, 10, 0.1


def _optim(**over: Any) -> SimpleNamespace:
    """An optim section as the schema declares it (defaults), with `over` set."""
    keys = dict(lr=2e-3, scaled_lr=None, min_lr_ratio=M, warmup_steps=W, schedule="cosine", decay_fraction=0.2,
                decay_shape="1-sqrt", decay_start_step=None, timescale=None)
    keys.update(over)
    ns = SimpleNamespace(**keys)
    ns.get = lambda key, default=None: getattr(ns, key, default)
    return ns


def _factor(steps_done: int, **over: Any) -> float:
    return Schedule.from_config(_optim(**over), T).factor(steps_done)


def _old_cosine(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """train/optim.py's lr_factor before schedules were configurable, verbatim."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize(("warmup", "max_steps", "ratio"), [(0, 1, 0.1), (5, 3, 0.1), (5, 100, 0.1), (7, 50, 0.0),
                                                            (0, 1000, 0.3)])
def test_cosine_is_todays_schedule_bit_for_bit(warmup: int, max_steps: int, ratio: float) -> None:
    sched = Schedule.from_config(_optim(warmup_steps=warmup, min_lr_ratio=ratio), max_steps)
    assert [sched.factor(s) for s in range(max_steps + 3)] == [
        _old_cosine(s, warmup, max_steps, ratio) for s in range(max_steps + 3)]


# (schedule keys, step k as metrics.jsonl numbers it, closed form); T=100 steps, warmup W=10, min_lr_ratio M=0.1.
CLOSED_FORMS = [
    # Warmup, the same for every schedule: k / W, the peak at step W.
    *[({"schedule": s}, 1, 1 / W) for s in SCHEDULES],
    *[({"schedule": s}, 5, 5 / W) for s in SCHEDULES],
    *[({"schedule": s}, W, 1.0) for s in SCHEDULES],
    # cosine as it always was: progress (k - 1 - W) / (T - W), the floor after the last step.
    ({"schedule": "cosine"}, W + 1, 1.0),
    ({"schedule": "cosine"}, 56, M + (1 - M) * 0.5 * (1 + math.cos(math.pi * 0.5))),
    ({"schedule": "cosine"}, T + 1, M),
    # linear: progress (k - W) / (T - W), the floor at step T.
    ({"schedule": "linear"}, 28, M + (1 - M) * (1 - 0.2)),
    ({"schedule": "linear"}, 55, M + (1 - M) * 0.5),
    ({"schedule": "linear"}, T, M),
    ({"schedule": "linear"}, T + 50, M),
    ({"schedule": "constant"}, W + 1, 1.0),
    ({"schedule": "constant"}, T, 1.0),  # min_lr_ratio means nothing to a constant rate
    # wsd: the peak up to step D = T - round(0.2 T) = 80, then progress (k - 80) / 20, the floor at step T.
    ({"schedule": "wsd"}, 50, 1.0),
    ({"schedule": "wsd"}, 80, 1.0),
    ({"schedule": "wsd"}, 90, M + (1 - M) * (1 - math.sqrt(0.5))),
    ({"schedule": "wsd", "decay_shape": "linear"}, 90, M + (1 - M) * 0.5),
    ({"schedule": "wsd", "decay_shape": "linear"}, 95, M + (1 - M) * 0.25),
    ({"schedule": "wsd", "decay_shape": "cosine"}, 85, M + (1 - M) * 0.5 * (1 + math.cos(math.pi * 0.25))),
    ({"schedule": "wsd", "decay_shape": "1-sqrt"}, 95, M + (1 - M) * (1 - math.sqrt(0.75))),
    ({"schedule": "wsd"}, T, M),
    ({"schedule": "wsd", "decay_fraction": 0.5}, 75, M + (1 - M) * (1 - math.sqrt(0.5))),
    # An explicit decay start wins over the fraction: the peak up to step 60, then progress (k - 60) / 40.
    ({"schedule": "wsd", "decay_start_step": 60}, 60, 1.0),
    ({"schedule": "wsd", "decay_start_step": 60}, 70, M + (1 - M) * (1 - math.sqrt(0.25))),
    ({"schedule": "wsd", "decay_start_step": 60, "decay_shape": "linear"}, 90, M + (1 - M) * 0.25),
    # Decay start at the end: the whole run is stable (annealed later by raising trainer.max_steps).
    ({"schedule": "wsd", "decay_start_step": T}, T, 1.0),
    ({"schedule": "wsd", "decay_start_step": T}, T + 1, 1.0),
    ({"schedule": "wsd", "decay_start_step": 0, "warmup_steps": 0, "decay_shape": "linear"}, 50, M + (1 - M) * 0.5),
    # inverse_sqrt: sqrt(tau / (tau + k - W)) after warmup, floored at M; tau defaults to W: sqrt(W / k).
    ({"schedule": "inverse_sqrt"}, 4 * W, math.sqrt(W / (4 * W))),
    ({"schedule": "inverse_sqrt"}, 100 * W, M),
    ({"schedule": "inverse_sqrt"}, 400 * W, M),
    ({"schedule": "inverse_sqrt", "timescale": 30}, 40, math.sqrt(30 / 60)),
    ({"schedule": "inverse_sqrt", "timescale": 30, "min_lr_ratio": 0.0}, 10 + 30 * 99, 0.1),
    ({"schedule": "inverse_sqrt", "warmup_steps": 0, "timescale": 4}, 1, math.sqrt(4 / 5)),
    ({"schedule": "inverse_sqrt", "warmup_steps": 0, "timescale": 4}, 12, 0.5),
]


@pytest.mark.parametrize(("keys", "step", "expected"), CLOSED_FORMS,
                         ids=[f"{'-'.join(map(str, k.values()))}@{n}" for k, n, _ in CLOSED_FORMS])
def test_every_schedule_follows_its_closed_form(keys: dict[str, Any], step: int, expected: float) -> None:
    assert _factor(step - 1, **keys) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_every_decay_shape_runs_from_the_peak_at_the_end_of_warmup_to_the_floor_at_the_last_step() -> None:
    for shape in DECAY_SHAPES:
        f = [_factor(k - 1, schedule="wsd", decay_shape=shape) for k in range(W, T + 1)]
        assert f[0] == 1.0 and f[-1] == pytest.approx(M)
        assert all(a >= b for a, b in zip(f, f[1:], strict=False)), shape


def _train(scheduler_cfg: SimpleNamespace, max_steps: int, steps: int,
           state: tuple[dict[str, Any], dict[str, Any]] | None = None) -> tuple[torch.optim.Optimizer, Any]:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=scheduler_cfg.lr)
    scheduler = build_scheduler(optimizer, scheduler_cfg, max_steps)
    if state is not None:
        optimizer.load_state_dict(state[0])  # as DCP restores it: the param groups' lr of the old run's end
        scheduler.load_state_dict(state[1])
    for _ in range(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


@pytest.mark.parametrize("keys", [{"schedule": "cosine"}, {"schedule": "linear"},
                                  {"schedule": "wsd", "decay_start_step": T}, {"schedule": "wsd"}])
def test_an_extended_run_trains_at_the_new_schedules_rate_from_its_first_step(keys: dict[str, Any]) -> None:
    """Today's bug: the first resumed step trained at the old end's rate (restored with the optimizer), the next
    one jumped to the new schedule's."""
    cfg = _optim(**keys)
    optimizer, scheduler = _train(cfg, T, T)
    saved = (optimizer.state_dict(), scheduler.state_dict())
    extended = Schedule.from_config(cfg, 150)
    for steps in range(4):
        resumed, _ = _train(cfg, 150, steps, saved)
        assert [g["lr"] for g in resumed.param_groups] == [cfg.lr * extended.factor(T + steps)], steps


def test_a_checkpoint_written_by_torchs_lambdalr_resumes_on_the_closed_form() -> None:
    """Checkpoints written before this change hold LambdaLR's state dict."""
    cfg = _optim()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    old = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 0.5)
    for _ in range(30):
        optimizer.step()
        old.step()
    resumed, _ = _train(cfg, T, 0, (optimizer.state_dict(), old.state_dict()))
    assert resumed.param_groups[0]["lr"] == cfg.lr * Schedule.from_config(cfg, T).factor(30)
