"""Issue 35's GPU paths on one CUDA GPU (skipped without CUDA): precision=fp8 under ddp and fsdp (torchao float8
linear layers; FSDP2's float8 all-gather), and the whole model compiled with CUDA graphs. Each trains 5 steps of
GPT-2 124M's body (dimensions divisible by 16) and learns, as the strategy x precision matrix does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conftest import hq, launch, read_metrics

pytestmark = pytest.mark.gpu

BODY = ["local.nproc=1", "local.backend=nccl", "model=gpt2_124m", "model.vocab_size=256", "optim.lr=1e-3",
        "data.seq_len=256", "trainer.micro_batch_size=4", "trainer.max_steps=5", "trainer.log_every=1",
        "logger.backend=none"]


def _fp8_capable() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.parametrize("case", [
    pytest.param(["precision=fp8", "strategy=ddp"], id="fp8-ddp"),
    pytest.param(["precision=fp8", "strategy=fsdp", "strategy.compile=true"], id="fp8-fsdp-compiled"),
    pytest.param(["precision=bf16", "strategy=single", "strategy.compile=true", "strategy.compile_unit=model",
                  "strategy.cuda_graphs=true"], id="model-compiled-cuda-graphs"),
])
def test_fast_paths_train(case: list[str], run_root: Path) -> None:
    if "precision=fp8" in case and not _fp8_capable():
        pytest.skip("float8 needs compute capability 9.0 or newer")
    out = launch(*BODY, *case, f"run.root={hq(run_root)}", "run.name=g")
    assert out.returncode == 0, out.stderr[-3000:]
    if "precision=fp8" in case:
        assert "linear layers in float8" in out.stderr
    rows = read_metrics(run_root / "g")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
