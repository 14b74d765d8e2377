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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_loss_equals_the_plain_loss(dtype: str) -> None:
    """The chunked loss (a large vocabulary's) against F.cross_entropy over an fp32 copy: the loss, and the gradient
    of the logits after a scale like accumulation's, with targets that don't count (IGNORE_INDEX) among them."""
    import torch
    import torch.nn.functional as F

    from train.data.batches import IGNORE_INDEX
    from train.loss import ChunkedCrossEntropy

    torch.manual_seed(0)
    logits = (3 * torch.randn(37, 101)).to(getattr(torch, dtype)).requires_grad_()
    targets = torch.randint(0, 101, (37,))
    targets[[0, 5, 36]] = IGNORE_INDEX
    chunked = ChunkedCrossEntropy.apply(logits, targets, 8)[0]  # 5 chunks, the last one short
    (chunked / 3).backward()
    got = logits.grad.clone()
    logits.grad = None
    plain = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum") / 34
    (plain / 3).backward()
    tol = {"float32": 1e-6, "bfloat16": 1e-2}[dtype]
    assert chunked.dtype == torch.float32 and chunked.item() == pytest.approx(plain.item(), rel=1e-6)
    assert got.dtype == logits.dtype
    torch.testing.assert_close(got.float(), logits.grad.float(), rtol=tol, atol=tol * 1e-2)
    assert (got[[0, 5, 36]] == 0).all(), "a target that does not count gets a gradient"


def test_chunked_only_where_the_fp32_copy_is_large() -> None:
    from contract.rules.loss_chunks import CHUNK_BYTES, chunk_rows, loss_bytes

    assert chunk_rows(8 * 64, 256) is None  # tiny: the plain loss, bit for bit as before
    rows = chunk_rows(8 * 1024, 128256)  # llama3_1b at micro batch 8: 4.2 GB of fp32 logits
    assert rows is not None and rows * 128256 * 4 <= CHUNK_BYTES
    plain = 8 * 1024 * 128256 * (2 + 8)
    assert loss_bytes(8 * 1024, 128256, 2) < plain / 2, "the estimate does not count what chunking saves"


def _strategy_cfg(**strategy: object) -> object:
    from omegaconf import OmegaConf

    s = {"name": "ddp", "backend": "torch", "compile": True, "compile_unit": "blocks", "cuda_graphs": False, **strategy}
    return OmegaConf.create({"strategy": s, "parallel": {"tp": 1, "pp": 1}, "data": {"document_mask": False}})


@pytest.mark.parametrize(("strategy", "on_gpus", "expect"), [
    ({"compile_unit": "model"}, False, None),
    ({"compile_unit": "model", "compile": False}, False, "add strategy.compile=true"),
    ({"compile_unit": "model", "name": "fsdp"}, False, "use strategy.compile_unit=blocks"),
    ({"cuda_graphs": True}, True, None),
    ({"cuda_graphs": True, "compile_unit": "model", "name": "single"}, True, None),
    ({"cuda_graphs": True, "compile": False}, True, "add strategy.compile=true"),
    ({"cuda_graphs": True}, False, "needs the ranks on NVIDIA GPUs"),
    ({"cuda_graphs": True, "name": "hsdp"}, True, "all-gathers each block's parameters into fresh memory"),
    ({"cuda_graphs": True, "name": "zero2", "backend": "deepspeed"}, True, "DeepSpeed's engine"),
])
def test_compile_unit_and_cuda_graphs_where_the_step_allows(strategy: dict, on_gpus: bool, expect: str | None) -> None:
    from contract.rules.compile_modes import compile_mode, compile_refusal

    cfg = _strategy_cfg(**strategy)
    got = compile_refusal(cfg, on_gpus)
    assert (got is None) if expect is None else (expect in got), got
    if expect is None:
        assert compile_mode(cfg.strategy) == ("reduce-overhead" if strategy.get("cuda_graphs") else None)


@pytest.mark.parametrize(("extra", "why"), [({"parallel": {"tp": 1, "pp": 2}}, "sends and receives activations"),
                                            ({"parallel": {"tp": 2, "pp": 1}}, "collectives run inside each block"),
                                            ({"data": {"document_mask": True}}, "no two steps are alike")])
def test_cuda_graphs_name_what_is_not_static(extra: dict, why: str) -> None:
    from omegaconf import OmegaConf

    from contract.rules.compile_modes import compile_refusal

    cfg = OmegaConf.merge(_strategy_cfg(cuda_graphs=True), extra)
    assert why in compile_refusal(cfg, True)
