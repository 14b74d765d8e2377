"""bench/loop_overhead_gpu.py's sync counter, without a GPU: the warnings torch.cuda.set_sync_debug_mode("warn")
gives are counted by the step the loop is in, other warnings pass, and the steady steps leave out log steps, the
step after each (a value read a step late), the first two and the last."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import train.loop as loop
from bench.loop_overhead_gpu import GPU_CASES, GPU_COMMON, SyncCounter


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
    assert set(GPU_CASES) == {"gpt2_124m mb8", "gpt2_350m mb8", "gpt2_350m mb16", "llama3_1b mb8", "llama3_1b mb8 fp8",
                              "llama3_8b_w4l mb8", "llama3_8b_w4l mb8 fp8"}


def test_the_8b_width_row_is_llama3_8bs_width_with_few_layers_and_names_its_bf16_layers() -> None:
    """Issue 46 item 2: the GPU arm's 8B-width rows (not run here: they need a GPU) compose to Llama 3 8B's width, and
    the fp8 row's plan line names the layers torchao's size rule keeps in bf16."""
    from contract.rules.float8 import plan_line
    from launcher.compose import compose_config

    cfg = compose_config([*GPU_COMMON, *GPU_CASES["llama3_8b_w4l mb8 fp8"]])
    m = cfg.model
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.ffn_hidden, m.n_layers) == (4096, 32, 8, 14336, 4)
    line = plan_line(cfg)
    assert "each block's 5 linear layers in float8" in line and "attn.k (4096 -> 1024), attn.v (4096 -> 1024) stay " \
        "in bf16" in line, line
