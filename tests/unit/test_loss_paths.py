"""The loss's paths (issue 46 item 1): chunked (logits given) and fused with the output layer (trainer.loss_impl=fused),
eager and compiled, against F.cross_entropy over the whole fp32 logits with z-loss's closed form: values and
gradients, with targets that don't count; and the plan's account of the path (contract/rules/loss_chunks.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from contract.rules import loss_chunks
from train.data.batches import IGNORE_INDEX
from train.loss import ChunkedCrossEntropy, losses
from train.model.fused_head import FusedHeadLoss, FusedLinearCrossEntropy

N, VOCAB, D = 37, 101, 16
Z = 1e-2


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g)
    weight = torch.randn(VOCAB, D, generator=g) * 0.5
    targets = torch.randint(0, VOCAB, (N,), generator=g)
    targets[[0, 5, 36]] = IGNORE_INDEX
    return h, weight, targets


def _reference(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, z_coef: float) -> tuple[torch.Tensor, ...]:
    """(total, cross-entropy, z-loss) over the whole fp32 logits, and the gradients of the total."""
    h, weight = h.clone().requires_grad_(), weight.clone().requires_grad_()
    logits = h @ weight.t()
    keep = targets != IGNORE_INDEX
    ce = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
    z = z_coef * torch.logsumexp(logits, dim=-1)[keep].pow(2).mean()
    (ce + z).backward()
    return (ce + z).detach(), ce.detach(), z.detach(), h.grad, weight.grad


def _fused(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int, z_coef: float,
           compiled: bool) -> tuple[torch.Tensor, ...]:
    h, weight = h.clone().requires_grad_(), weight.clone().requires_grad_()
    total, ce, z = FusedLinearCrossEntropy.apply(h, weight, targets, rows, z_coef, compiled, torch.float32)
    (total * 3).backward()  # a scale, as accumulation's: the gradients made in forward are scaled in backward
    return total.detach(), ce, z, h.grad / 3, weight.grad / 3


def _chunked(logits: torch.Tensor, targets: torch.Tensor, rows: int, z_coef: float,
             compiled: bool) -> tuple[torch.Tensor, ...]:
    logits = logits.clone().requires_grad_()
    total, ce, z = ChunkedCrossEntropy.apply(logits, targets, rows, z_coef, compiled)
    total.backward()
    return total.detach(), ce, z, logits.grad


@pytest.mark.parametrize("z_coef", [0.0, Z])
def test_fused_and_chunked_equal_f_cross_entropy_with_ignored_targets_and_z_loss(z_coef: float) -> None:
    h, weight, targets = _inputs()
    want = _reference(h, weight, targets, z_coef)
    got = _fused(h, weight, targets, 8, z_coef, compiled=False)  # 5 chunks, the last one short
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    logits = (h @ weight.t()).detach()
    ref_logits = logits.clone().requires_grad_()
    keep = targets != IGNORE_INDEX
    ref = F.cross_entropy(ref_logits, targets, ignore_index=IGNORE_INDEX)
    ref = ref + z_coef * torch.logsumexp(ref_logits, dim=-1)[keep].pow(2).mean()
    ref.backward()
    total, ce, z, grad = _chunked(logits, targets, 8, z_coef, compiled=False)
    torch.testing.assert_close(total, ref.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ce, want[1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_logits.grad, rtol=1e-5, atol=1e-7)
    assert (grad[[0, 5, 36]] == 0).all(), "a target that does not count gets a gradient"


def test_compiled_chunk_arithmetic_equals_f_cross_entropy() -> None:
    """torch.compile of each chunk's arithmetic (strategy.compile): one chunk, one compile, used by both paths."""
    h, weight, targets = _inputs(1)
    want = _reference(h, weight, targets, Z)
    got = _fused(h, weight, targets, N, Z, compiled=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    eager = _chunked((h @ weight.t()).detach(), targets, N, Z, compiled=False)
    compiled = _chunked((h @ weight.t()).detach(), targets, N, Z, compiled=True)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_micro_batch_with_no_counted_target_trains_nothing() -> None:
    h, weight, targets = _inputs()
    targets[:] = IGNORE_INDEX
    total, ce, z, grad_h, grad_w = _fused(h, weight, targets, 8, Z, compiled=False)
    assert float(total) == 0.0 and float(ce) == 0.0 and float(z) == 0.0
    assert not grad_h.any() and not grad_w.any()


def test_the_transformer_with_a_fused_loss_trains_as_with_its_logits() -> None:
    """Our transformer handed the targets (trainer.loss_impl=fused): the same loss and every parameter's gradient
    (the output weight tied to the embedding) as its logits through the loss, in fp32; and in bf16 autocast close
    to it."""
    from train.model.transformer import build_model

    m = OmegaConf.create({"vocab_size": 96, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                          "ffn_hidden": 64, "max_seq_len": 16, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm",
                          "rope_theta": 10000.0, "tie_embeddings": True, "dropout": 0.0, "init_std": 0.02})
    torch.manual_seed(0)
    model = build_model(m)
    tokens = torch.randint(0, 96, (3, 16))
    targets = torch.randint(0, 96, (3, 16))
    targets[0, :5] = IGNORE_INDEX

    def grads(fused: bool, dtype: torch.dtype | None) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        model.head_loss = FusedHeadLoss(Z, compiled=False) if fused else None
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            if fused:
                total, _, _ = model(tokens, targets=targets)
            else:
                logits = model(tokens)
        if not fused:
            total, _, _ = losses(logits.reshape(-1, 96), targets.reshape(-1), Z)
        total.backward()
        return float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain_loss, plain = grads(False, None)
    fused_loss, fused = grads(True, None)
    assert fused_loss == pytest.approx(plain_loss, rel=1e-6)
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    bf16_plain, _ = grads(False, torch.bfloat16)
    bf16_fused, grads_bf16 = grads(True, torch.bfloat16)
    assert bf16_fused == pytest.approx(bf16_plain, rel=1e-2)
    torch.testing.assert_close(grads_bf16["embed.weight"], plain["embed.weight"], rtol=5e-2, atol=5e-3)


def _cfg(**trainer: object) -> object:
    return OmegaConf.create({"trainer": {"loss_impl": "fused", **trainer}, "optim": {"z_loss": 0.0},
                             "strategy": {"compile": False}, "parallel": {"tp": 1, "pp": 1},
                             "model": {"name": "llama3_1b", "_target_": None, "config_path": None}})


def test_the_fused_path_holds_no_logits_and_is_refused_where_it_cannot_run() -> None:
    tokens, vocab = 8192, 128256
    plain = loss_chunks.loss_bytes(tokens, vocab, 2, "plain")
    chunked = loss_chunks.loss_bytes(tokens, vocab, 2)
    fused = loss_chunks.loss_bytes(tokens, vocab, 2, "fused", d_model=2048)
    assert fused < plain / 3 and fused < chunked / 2, (fused, chunked, plain)
    cfg = _cfg()
    assert loss_chunks.path(cfg, 64, 256) == "fused" and loss_chunks.fused_refusal(cfg) is None
    assert "fused with the output layer" in loss_chunks.plan_line(tokens, vocab, cfg)
    cfg.parallel.tp = 2
    assert "parallel.tp=2" in loss_chunks.fused_refusal(cfg) and "trainer.loss_impl=chunked" in \
        loss_chunks.fused_refusal(cfg)
    cfg.parallel.tp, cfg.model._target_ = 1, "mine.Model"
    assert "another model" in loss_chunks.fused_refusal(cfg)
    chunked_cfg = _cfg(loss_impl="chunked")
    assert loss_chunks.path(chunked_cfg, 64, 256) == "plain" and loss_chunks.path(chunked_cfg, tokens, vocab) == \
        "chunked"


def test_the_plan_estimates_the_fused_path_smaller_and_says_it() -> None:
    from launcher.compose import compose_config
    from launcher.plan.cross_checks import count_parameters
    from launcher.plan.estimate import ModelShape, estimate_memory

    base = ["model=llama3_1b", "precision=bf16", "data.seq_len=1024", "trainer.micro_batch_size=8"]
    temporary = {}
    for impl in ("chunked", "fused"):
        cfg = compose_config([*base, f"trainer.loss_impl={impl}"])
        shape = ModelShape.ours(cfg.model, count_parameters(cfg.model))
        temporary[impl] = estimate_memory(cfg, 1, 1, shape, margin_bytes=0, fragmentation=0).temporary
        line = loss_chunks.plan_line(8192, 128256, cfg)
        assert ("fused with the output layer" in line) == (impl == "fused"), line
    # the logits and their gradient (2 x 8192 x 128256 x 2 bytes) are gone; the hidden states' and the weight's
    # fp32 gradients come instead: 2.9 GB less
    saved = loss_chunks.loss_bytes(8192, 128256, 2) - loss_chunks.loss_bytes(8192, 128256, 2, "fused", 2048)
    assert saved > 2.5 * 1024**3
    assert temporary["chunked"] - temporary["fused"] == pytest.approx(saved), temporary


def test_the_strategy_hands_our_transformer_the_fused_loss_and_the_step_takes_it() -> None:
    """trainer.loss_impl=fused reaches the ranks: set-up gives the model its fused loss, and train_step's path (the
    model called with the targets) returns the loss, not logits; a user's model is refused in one line."""
    from contract.errors import ConfigError
    from launcher.compose import compose_config
    from train.distributed import DistEnv
    from train.model.build import build_model
    from train.strategies import build_strategy

    env = DistEnv(0, 0, 1, 1, "127.0.0.1", 0, "local", "localhost")
    cfg = compose_config(["strategy=single", "trainer.loss_impl=fused", "optim.z_loss=1e-3"])
    strategy = build_strategy(cfg, env, torch.device("cpu"))
    model = strategy.setup(build_model(cfg.model), train=False)
    assert strategy.fused_loss and isinstance(model.head_loss, FusedHeadLoss) and model.head_loss.z_coef == 1e-3
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 16))
    total, ce, z = model(tokens, targets=tokens)
    assert total.requires_grad and float(total.detach()) == pytest.approx(float(ce + z))
    chunked = compose_config(["strategy=single"])
    plain = build_strategy(chunked, env, torch.device("cpu"))
    assert not plain.fused_loss and plain.setup(build_model(chunked.model), train=False).head_loss is None
    cfg.model._target_ = "torch.nn.Linear"
    with pytest.raises(ConfigError, match="trainer.loss_impl=chunked"):
        build_strategy(cfg, env, torch.device("cpu")).setup(torch.nn.Linear(2, 2), train=False)


def test_the_fused_loss_inside_a_model_compiled_whole_equals_the_logits_path() -> None:
    """strategy.compile_unit=model with trainer.loss_impl=fused: the fused loss is traced into the model's graph
    (its chunk arithmetic with it, not compiled apart); loss and gradients equal the eager logits path's."""
    from train.model.transformer import build_model

    m = OmegaConf.create({"vocab_size": 96, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                          "ffn_hidden": 64, "max_seq_len": 16, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm",
                          "rope_theta": 10000.0, "tie_embeddings": True, "dropout": 0.0, "init_std": 0.02})
    torch.manual_seed(0)
    model = build_model(m)
    tokens, targets = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    targets[0, :5] = IGNORE_INDEX
    want, _, _ = losses(model(tokens).reshape(-1, 96), targets.reshape(-1), Z)
    want.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.head_loss = FusedHeadLoss(Z, compiled=True)
    model.compile()
    total, _, _ = model(tokens, targets=targets)
    total.backward()
    assert float(total.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[name], rtol=1e-5, atol=1e-7, msg=name)
