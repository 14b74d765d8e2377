"""The optimizers (contract/rules/optimizers.py, train/optim.py): the plan's optimizer memory is the state each one
really keeps, weight decay skips what optim.no_decay names, a step the stability verdict skips changes nothing, and
the launch refuses what an optimizer does not read."""

from __future__ import annotations

import math

import pytest
import torch

from contract.errors import ConfigError
from contract.rules.optimizers import OPTIMIZERS, check_optim
from launcher.compose import compose_config
from launcher.plan.cross_checks import count_parameters
from launcher.plan.estimate import ModelShape, estimate_memory
from tests.conftest import launch
from train.model.blocks import prepare_blocks
from train.model.transformer import build_model
from train.optim import build_optimizer, param_groups
from train.stability.verdict import apply_with_skip
from train.strategies.base import init_optimizer_state

GPT2_STYLE = ["model.position=learned", "model.mlp=gelu", "model.norm=layernorm", "model.tie_embeddings=false"]


def _optimizer_bytes(overrides: list[str]) -> float:
    """The plan's optimizer memory (one rank holding everything: no sharding, fp32)."""
    cfg = compose_config(["strategy=single", "precision=fp32", *overrides])
    shape = ModelShape.ours(cfg.model, count_parameters(cfg.model))
    return estimate_memory(cfg, 1, 1, shape, margin_bytes=0, fragmentation=0).optimizer


def _built(overrides: list[str]) -> tuple[object, torch.nn.Module, torch.optim.Optimizer]:
    cfg = compose_config(["strategy=single", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    blocks = prepare_blocks(model, cfg.model, cfg.strategy)
    optimizer = build_optimizer(model, cfg.optim, blocks=blocks)
    init_optimizer_state(optimizer)
    return cfg, model, optimizer


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """What the optimizer holds beside the parameters (its step counters, one number each, left out)."""
    return sum(t.nbytes for s in optimizer.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


@pytest.mark.parametrize("model", [[], GPT2_STYLE], ids=["llama-style", "gpt2-style"])
@pytest.mark.parametrize("optim", OPTIMIZERS)
def test_the_plans_optimizer_memory_is_the_state_the_optimizer_keeps(optim: str, model: list[str]) -> None:
    overrides = [f"optim={optim}", *model]
    _, _, optimizer = _built(overrides)
    kept = _state_bytes(optimizer)
    assert kept > 0
    assert _optimizer_bytes(overrides) == kept


def test_llama3_8b_optimizer_memory_differs_as_the_state_does() -> None:
    base = ["model=llama3_8b"]
    n = count_parameters(compose_config(["strategy=single", *base]).model)
    adamw, sgd, adafactor, lion, muon = (_optimizer_bytes([*base, f"optim={o}"])
                                         for o in ("adamw", "sgd", "adafactor", "lion", "muon"))
    assert adamw == 8 * n  # two fp32 moments
    assert sgd == lion == 4 * n  # one momentum buffer
    assert _optimizer_bytes([*base, "optim=sgd", "optim.momentum=0"]) == 0  # plain SGD keeps nothing
    # Factored: a row and a column per matrix; 4096-wide matrices, so well under a thousandth of AdamW's.
    d, f, v, layers, kv = 4096, 14336, 128256, 32, 1024
    matrices = layers * ((d + d) * 2 + (kv + d) * 2 + (f + d) * 3) + 2 * (v + d)
    vectors = (2 * layers + 1) * d
    assert adafactor == 4 * (matrices + vectors) and adafactor < adamw / 1000
    # Muon: one buffer for the blocks' matrices, AdamW's two for the embeddings, the head and the norms.
    outside = 2 * v * d + vectors
    assert muon == 4 * (n - outside) + 8 * outside and sgd < muon < adamw


def test_the_plan_names_the_optimizer_what_decay_skips_and_the_state() -> None:
    out = launch("optim=sgd", "launcher.dry_run=true")
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("optimizer sgd (momentum 0.9); L2 weight decay 0.0001, not on norms, biases, embeddings; state 4 "
            "bytes/parameter") in out.stderr
    out = launch("optim=muon", "optim.no_decay=[vector]", "launcher.dry_run=true")
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("optimizer muon (momentum 0.95, nesterov, 5 Newton-Schulz steps on the blocks' matrices; AdamW (betas "
            "0.9/0.95) on the rest); weight decay 0.1, not on tensors of fewer than 2 dims; state") in out.stderr


def _decayed(overrides: list[str]) -> set[str]:
    cfg = compose_config(["strategy=single", *overrides])
    model = build_model(cfg.model)
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)] for g in param_groups(model, cfg.optim) if g["weight_decay"] > 0 for p in g["params"]}


def test_weight_decay_skips_what_no_decay_names() -> None:
    cfg = compose_config(["strategy=single", *GPT2_STYLE])
    every = {name for name, _ in build_model(cfg.model).named_parameters()}
    linear = {n for n in every if any(k in n for k in (".q.", ".k.", ".v.", ".out.", ".up.", ".down."))}
    assert linear and all(n.endswith(".weight") for n in linear)
    # The default: norms (LayerNorm weight and bias), biases and both embedding tables are not decayed; the
    # untied output layer is.
    assert _decayed(GPT2_STYLE) == linear | {"lm_head.weight"}
    # The rule before optim.no_decay: every tensor of two or more dims, embeddings included.
    assert _decayed([*GPT2_STYLE, "optim.no_decay=[vector]"]) == linear | {"lm_head.weight", "embed.weight",
                                                                            "pos_embed.weight"}
    assert _decayed([*GPT2_STYLE, "optim.no_decay=[]"]) == every
    assert _decayed([*GPT2_STYLE, "optim.no_decay=[embedding]"]) == every - {"embed.weight", "pos_embed.weight"}
    assert _decayed([*GPT2_STYLE, "optim.weight_decay=0"]) == set()
    # Tied: the output layer is the embedding table, and is not decayed by default.
    assert "embed.weight" not in _decayed([])


def test_muon_steps_the_blocks_matrices_and_adamw_the_rest() -> None:
    _, model, optimizer = _built(["optim=muon"])
    names = {id(p): name for name, p in model.named_parameters()}
    muon = {names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    assert muon == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert {k for s in optimizer.state.values() for k in s} == {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"}


@pytest.mark.parametrize("optim", OPTIMIZERS)
def test_a_step_the_verdict_skips_changes_nothing(optim: str) -> None:
    cfg, model, optimizer = _built([f"optim={optim}"])
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    for _ in range(2):  # some state to keep
        model(x).float().logsumexp(-1).mean().backward()
        apply_with_skip(optimizer, torch.tensor(0.0))
        optimizer.zero_grad(set_to_none=True)
    before = ([p.detach().clone() for p in model.parameters()],
              {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()})
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    apply_with_skip(optimizer, torch.tensor(1.0))
    for p, old in zip(model.parameters(), before[0], strict=True):
        assert torch.equal(p.detach(), old)
    for p, s in optimizer.state.items():
        for k, v in s.items():
            assert torch.equal(v, before[1][id(p)][k]), (optim, k)
    model(x).float().logsumexp(-1).mean().backward()
    apply_with_skip(optimizer, torch.tensor(0.0))  # and a step that is not skipped is applied
    assert not all(torch.equal(p.detach(), old) for p, old in zip(model.parameters(), before[0], strict=True))


def test_keys_an_optimizer_needs_or_does_not_read_are_refused() -> None:
    cfg = compose_config(["optim=sgd", "optim.momentum=0", "optim.nesterov=true"])
    with pytest.raises(ConfigError, match="optim.nesterov=true needs momentum"):
        check_optim(cfg.optim)
    cfg = compose_config(["optim=muon", "optim.ns_steps=null"])
    with pytest.raises(ConfigError, match=r"optim=muon needs optim.ns_steps: set it \(conf/optim/muon.yaml"):
        check_optim(cfg.optim)
    cfg = compose_config(["optim=adafactor", "optim.eps=1e-6"])
    with pytest.raises(ConfigError, match="optim.eps=1e-06 has no effect on optim=adafactor"):
        check_optim(cfg.optim)
    for optim in OPTIMIZERS:  # each group option as it stands is accepted
        check_optim(compose_config([f"optim={optim}"]).optim)


def test_a_checkpoint_grouped_before_no_decay_resumes_with_this_runs_groups() -> None:
    """Written with the old rule (embeddings decayed), loaded into today's default grouping: each parameter gets its
    saved state, each group keeps its configured settings (DCP alone left the decayed group without them)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from train.checkpoints.state import ModelOptimState

    cfg, model, old = _built(["optim.no_decay=[vector]"])
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    model(x).float().logsumexp(-1).mean().backward()
    old.step()
    model_sd, optim_sd = get_state_dict(model, old)
    assert [(len(g["params"]), g["weight_decay"]) for g in optim_sd["param_groups"]] == [(15, 0.1), (5, 0.0)]
    new = build_optimizer(model, compose_config(["strategy=single"]).optim)  # the default no_decay
    init_optimizer_state(new)
    configured = [{k: v for k, v in g.items() if k != "params"} for g in new.param_groups]
    ModelOptimState(model, new).load_state_dict({"model": model_sd, "optim": optim_sd})
    assert [{k: v for k, v in g.items() if k != "params"} for g in new.param_groups] == configured
    assert [(len(g["params"]), g["weight_decay"]) for g in new.param_groups] == [(14, 0.1), (6, 0.0)]
    for p in model.parameters():
        assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])
    model(x).float().logsumexp(-1).mean().backward()
    new.step()  # and it steps


def test_a_run_named_before_the_optimizer_keys_keeps_its_name() -> None:
    """The same command resumes a run started before optim.no_decay and the optimizers' own keys existed."""
    from omegaconf import OmegaConf

    from launcher.plan.run_name import derived_run_name

    cfg = compose_config([])
    old = OmegaConf.to_container(cfg, resolve=True)
    for key in ("no_decay", "momentum", "nesterov", "ns_steps", "beta2_decay", "clip_threshold"):
        del old["optim"][key]  # type: ignore[index]
    assert derived_run_name(OmegaConf.create(old)) == derived_run_name(cfg)
    assert derived_run_name(compose_config(["optim.no_decay=[vector]"])) != derived_run_name(cfg)
