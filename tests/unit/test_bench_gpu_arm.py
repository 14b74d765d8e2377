"""bench/loop_overhead_gpu.py's sync counter, without a GPU: the warnings torch.cuda.set_sync_debug_mode("warn")
gives are counted by the step the loop is in, other warnings pass, and the steady steps leave out log steps, the
step after each (a value read a step late), the first two and the last."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import train.loop as loop
from bench.loop_overhead_gpu import GPU_CASES, SyncCounter


def test_syncs_are_counted_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def fake_step(model: object, strategy: object, source: object, state: SimpleNamespace) -> None:
        if state.step + 1 in (4, 10, 11):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    monkeypatch.setattr(loop, "train_step", fake_step)
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *rest, **kw: shown.append(str(message)))
    with SyncCounter() as counter:
        for step in range(20):
            loop.train_step(None, None, None, SimpleNamespace(step=step))
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert modes == ["warn", "default"] and loop.train_step is fake_step
    assert shown == ["another warning"], "a warning that is no sync is swallowed"
    assert dict(counter.by_step) == {4: 1, 10: 1, 11: 1}
    mean, steady = counter.per_steady_step(20, 10)
    assert 10 not in steady and 11 not in steady and 4 in steady and 20 not in steady and 2 not in steady
    assert mean == pytest.approx(1 / len(steady))


def test_the_arm_covers_the_rows_of_issue_35() -> None:
    assert set(GPU_CASES) == {"gpt2_124m mb8", "gpt2_350m mb8", "gpt2_350m mb16", "llama3_1b mb8", "llama3_1b mb8 fp8"}
