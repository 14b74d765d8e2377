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
