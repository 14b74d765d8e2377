"""precision=fp8 (issue 35 item 4): the plan's account of it, and the conversion of our transformer's blocks, run
on CPU through torchao's emulation (float8 rounding in high-precision matmuls). The GPU path itself runs in
bench/loop_overhead.py's GPU arm (llama3_1b fp8) on a lent H100/H200."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from contract.errors import ConfigError
from contract.rules import float8
from contract.rules.flops import flops_per_token


def _cfg(**model: object) -> object:
    m = {"name": "tiny", "vocab_size": 256, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": None,
         "ffn_hidden": 256, "max_seq_len": 64, "position": "rope", "mlp": "swiglu", "norm": "rmsnorm",
         "norm_eps": 1e-5, "rope_theta": 10000.0, "tie_embeddings": True, "dropout": 0.0, "init_std": 0.02,
         "_target_": None, "config_path": None, **model}
    # float8_filter=all: the tiny dimensions here are all below torchao's size rule (which test_the_size_rule_*
    # checks on the presets)
    return OmegaConf.create({"model": m, "precision": {"name": "fp8", "compute_dtype": "bfloat16",
                                                       "float8_recipe": "tensorwise", "float8_filter": "all"},
                             "strategy": {"name": "fsdp", "backend": "torch"}, "parallel": {"tp": 1}})


def test_refusals_name_the_fix() -> None:
    assert float8.config_refusal(_cfg()) is None
    assert "divisible by 16" in float8.config_refusal(_cfg(d_model=72))
    assert float8.gpu_refusal("h100_80gb", None, "cluster x") is None
    assert float8.gpu_refusal(None, (9, 0), "this machine") is None
    assert "has 8.0" in float8.gpu_refusal(None, (8, 0), "this machine")
    assert "has a100_80gb" in float8.gpu_refusal("a100_80gb", None, "cluster y")


def test_mfu_counts_each_flop_at_its_own_peak() -> None:
    m = _cfg().model
    total, fp8_share = flops_per_token(m, 64), float8.float8_flops_per_token(m)
    assert 0 < fp8_share < total
    peak = float8.peak_tflops("fp8", {"bf16": 989.0, "fp8": 1979.0}, m, 64)
    assert 989.0 < peak < 1979.0
    assert total / peak == pytest.approx(fp8_share / 1979.0 + (total - fp8_share) / 989.0)
    assert float8.peak_tflops("fp8", {"bf16": 989.0}, m, 64) == 989.0  # no fp8 peak declared: bf16's
    assert float8.peak_tflops("bf16", {"bf16": 989.0, "fp8": 1979.0}, m, 64) == 989.0


def test_blocks_convert_and_train_in_float8_emulated() -> None:
    from torchao.float8.float8_linear import Float8Linear

    from train.model.build import build_model, logits_of
    from train.model.float8 import convert

    cfg = _cfg()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    plain = build_model(cfg.model)
    plain.load_state_dict(model.state_dict())
    assert convert(model, cfg, torch.device("cpu"), emulate=True) == 2 * 7  # q k v out gate up down per block
    assert not isinstance(model.lm_head, Float8Linear), "the output layer stays in bf16"
    assert sorted(model.state_dict()) == sorted(plain.state_dict()), "checkpoint names change"
    tokens = torch.randint(0, 256, (2, 16))
    losses = []
    for net in (model, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = logits_of(net(tokens[:, :-1]))
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), tokens[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert losses[0] == pytest.approx(losses[1], rel=0.02), "float8 rounding moved the loss further than it should"


def test_the_rank_refuses_without_a_hopper_gpu() -> None:
    from train.model.build import build_model
    from train.model.float8 import convert

    cfg = _cfg()
    with pytest.raises(ConfigError, match="compute capability 9.0 or newer"):
        convert(build_model(cfg.model), cfg, torch.device("cpu"))


def test_a_dry_run_for_an_h100_cluster_plans_fp8_from_a_machine_without_gpus(tmp_path) -> None:
    """The login side has no GPU: the cluster's gpu_type decides, and the plan names fp8, its FLOPs share, the
    float8 all-gather and the mixed peak its MFU counts against."""
    import json

    from tests.conftest import hq, launch

    out = launch("+cluster=h100x8", "model=llama3_1b", "precision=fp8", "strategy=fsdp", "launcher.dry_run=true",
                 f"run.root={hq(tmp_path)}", "run.name=fp8", CUDA_VISIBLE_DEVICES="")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "precision fp8: each block's 5 linear layers in float8 via torchao (tensorwise scaling, all-gathered in " \
           "float8 by FSDP2)" in out.stderr
    assert "attn.k (2048 -> 512), attn.v (2048 -> 512) stay in bf16, too small for float8 to pay" in out.stderr
    plan = json.loads((tmp_path / "fp8" / "plan.json").read_text())
    assert 989.0 < plan["budget"]["peak_tflops"] < 1979.0
    assert any(line.startswith("loss: chunked") for line in plan["step"])


def test_a_mixture_of_experts_router_stays_out_of_float8() -> None:
    """The router is computed in fp32 (train/model/moe.py): with 16 experts its dimensions divide by 16, and it must
    still not become a Float8Linear (nor be all-gathered in float8); the attention and shared expert's layers do."""
    from torchao.float8.float8_linear import Float8Linear

    from train.model.build import build_model
    from train.model.float8 import convert

    moe = {"num_experts": 16, "top_k": 2, "capacity_factor": 0.0, "shared_experts": 1, "aux_loss_coef": 0.01,
           "z_loss_coef": 0.001, "every": 1}
    cfg = _cfg(moe=moe)
    model = build_model(cfg.model)
    converted = convert(model, cfg, torch.device("cpu"), emulate=True)
    routers = [name for name, m in model.named_modules() if name.endswith(".router")]
    assert routers and not any(isinstance(model.get_submodule(name), Float8Linear) for name in routers)
    assert converted == 2 * (4 + 3)  # q k v out, and the shared expert's gate up down, per block


@pytest.mark.parametrize(("every", "shared"), [(1, 0), (2, 1)])
def test_the_plans_float8_share_of_a_mixture_of_experts_is_what_convert_converts(every: int, shared: int) -> None:
    """The plan's float8 parameters (its FLOP share, MFU peak and memory) count what train/model/float8.py converts:
    the attention and the dense and shared MLPs, never the routed experts (no linear layers) nor the router."""
    from torchao.float8.float8_linear import Float8Linear

    from train.model.build import build_model
    from train.model.float8 import convert

    moe = {"num_experts": 16, "top_k": 2, "capacity_factor": 0.0, "shared_experts": shared, "aux_loss_coef": 0.01,
           "z_loss_coef": 0.001, "every": every}
    cfg = _cfg(moe=moe)
    model = build_model(cfg.model)
    convert(model, cfg, torch.device("cpu"), emulate=True)
    converted = sum(m.weight.numel() for m in model.modules() if isinstance(m, Float8Linear))
    assert float8.float8_params_per_block(cfg.model) * cfg.model.n_layers == converted
    assert "not the routed experts" in float8.plan_line(OmegaConf.merge(cfg, {"data": {"seq_len": 64}}))


PRESETS = ["gpt2_124m", "gpt2_350m", "llama3_1b", "llama3_8b", "llama3_70b"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("preset", PRESETS)
def test_the_size_rule_is_torchaos_and_convert_and_the_plan_agree_on_it(preset: str, recipe: str) -> None:
    """precision.float8_filter=auto: the layers contract/rules/float8.py leaves in bf16 are those torchao's own
    filter for the recipe (_auto_filter_for_recipe, torchtitan's auto_filter_small_kn) refuses, on every preset's
    block shapes; convert() converts the others, and the plan's FLOP share counts them."""
    from torchao.float8 import _auto_filter_for_recipe

    from launcher.compose import compose_config
    from train.model.float8 import convert

    cfg = compose_config([f"model={preset}", "precision=bf16"])
    torchao_filter = _auto_filter_for_recipe(recipe, [])
    precision = OmegaConf.create({"name": "fp8", "float8_recipe": recipe, "float8_filter": "auto"})
    kept = float8.kept_in_bf16(cfg.model, precision)
    for name, (k, n) in float8.linear_shapes(cfg.model).items():
        torchao_converts = torchao_filter(torch.nn.Linear(k, n, bias=False, device="meta"), f"blocks.0.{name}")
        assert torchao_converts == (name not in kept), (preset, recipe, name, k, n)
    small = _cfg(d_model=128, n_heads=4, ffn_hidden=256, n_layers=1)
    small.precision.float8_recipe, small.precision.float8_filter = recipe, "auto"
    small_model = {"tensorwise": 0, "rowwise": 0}[recipe]
    assert float8.float8_params_per_block(small.model, small.precision) == small_model
    assert "precision.float8_filter=all" in float8.config_refusal(small)  # nothing would run in float8: refused
    if preset == "llama3_8b":  # the 8B-width row of the GPU bench: what is converted there
        wide = _cfg(d_model=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, n_layers=1)
        wide.precision.float8_recipe, wide.precision.float8_filter = recipe, "auto"
        from train.model.build import build_model

        with torch.device("meta"):  # the shapes only: 218M parameters a block
            model = build_model(OmegaConf.merge(wide.model, {"vocab_size": 256, "max_seq_len": 16}))
        converted = convert(model, wide, torch.device("cpu"), emulate=True)
        assert converted == len(float8.converted_shapes(wide.model, wide.precision))
