"""Less host work per step (issue 35 item 3): the garbage collector kept off the step, the optimizer's kernels."""

from __future__ import annotations

import gc

import pytest

from train.gc_control import GcControl


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The generations gc.collect was asked for, without collecting (a real one is slow and proves nothing)."""
    seen: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: seen.append(generation) or 0)
    return seen


def test_gc_frozen_after_setup_then_collected_every_n_steps(collections: list[int]) -> None:
    assert gc.isenabled()
    control = GcControl(3)
    try:
        control.start()
        assert not gc.isenabled(), "automatic collection stays on during training"
        assert gc.get_freeze_count() > 0, "what set-up made is not frozen"
        assert collections == [2], "set-up's garbage is not collected before the freeze"
        for step in range(1, 8):
            control.step(step)
        assert collections == [2, 1, 1], "a young-generation collection every 3 steps (3 and 6)"
    finally:
        control.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0, "close() does not give the collector back"


def test_gc_every_zero_leaves_python_alone(collections: list[int]) -> None:
    control = GcControl(0)
    control.start()
    for step in range(1, 5):
        control.step(step)
    control.close()
    assert gc.isenabled() and collections == []


def test_fused_where_the_parameters_allow() -> None:
    import torch

    from train.optim import kernel_choice

    cpu = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert kernel_choice(cpu) == ("fused", "every parameter on cpu")
    kind, reason = kernel_choice(cpu, fused=False, why_not="fp16's GradScaler skips steps itself")
    assert (kind, reason) == ("foreach", "fp16's GradScaler skips steps itself")
    kind, reason = kernel_choice([*cpu, torch.zeros(2, dtype=torch.int64)])
    assert kind == "foreach" and "torch.int64" in reason
    kind, reason = kernel_choice([*cpu, torch.zeros(2, device="meta")])
    assert kind == "foreach" and "meta" in reason


def test_the_optimizer_steps_with_the_kernels_chosen() -> None:
    import torch
    from omegaconf import OmegaConf

    from train.optim import build_optimizer

    model = torch.nn.Linear(4, 4)
    optim = OmegaConf.create({"name": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                              "weight_decay": 0.1, "no_decay": ["bias"]})
    assert build_optimizer(model, optim).defaults["fused"] is True
    foreach = build_optimizer(model, optim, fused=False)
    assert foreach.defaults["foreach"] is True and not foreach.defaults["fused"]
