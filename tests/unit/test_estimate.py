"""The launch plan's memory estimate, fit check, strategy=auto and LR scaling (launcher/plan/estimate.py, fit.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from launcher.compose import compose_config
from launcher.plan.cross_checks import count_parameters
from launcher.plan.estimate import (
    FP32,
    ModelShape,
    block_activation_bytes,
    estimate_memory,
    head_activation_bytes,
)
from tests.conftest import hq, launch

SEVEN_B = ["model=llama3_8b", "model.vocab_size=32000", "model.n_kv_heads=null", "model.ffn_hidden=11008",
           "+cluster=a100x16"]


def _states_per_param(strategy: str, precision: str, world: int) -> float:
    cfg = compose_config([*SEVEN_B, f"strategy={strategy}", f"precision={precision}"])
    n = count_parameters(cfg.model)
    est = estimate_memory(cfg, world, 2, ModelShape.ours(cfg.model, n), margin_bytes=0, fragmentation=0)
    return est.states / n


@pytest.mark.parametrize("world", [8, 16, 64])
def test_mixed_precision_adam_bytes_per_parameter_match_the_zero_paper(world: int) -> None:
    n = world
    assert 6.0e9 < count_parameters(compose_config(SEVEN_B).model) < 7.5e9
    assert _states_per_param("ddp", "bf16", n) == pytest.approx(16)
    assert _states_per_param("zero1", "bf16", n) == pytest.approx(4 + 12 / n)
    assert _states_per_param("zero2", "bf16", n) == pytest.approx(2 + 14 / n)
    assert _states_per_param("zero3", "bf16", n) == pytest.approx(16 / n)
    assert _states_per_param("fsdp", "bf16", n) == pytest.approx(16 / n)  # fp32 weights and grads, sharded


def _saved_activation_bytes(overrides: list[str]) -> tuple[int, float]:
    """Bytes autograd saves for backward in one forward (parameters excluded), and the estimate."""
    from train.model.blocks import prepare_blocks
    from train.model.transformer import build_model
    from train.observe.memory import saved_tensor_bytes

    cfg = compose_config(overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    prepare_blocks(model, cfg.model, cfg.strategy)
    b, t = cfg.trainer.micro_batch_size, cfg.data.seq_len
    x = torch.randint(0, cfg.model.vocab_size, (b, t))
    saved = saved_tensor_bytes(lambda: F.cross_entropy(model(x).float().flatten(0, 1), x.flatten()), owned_by=model)
    m = cfg.model
    per_layer = FP32 * m.d_model if cfg.strategy.activation_checkpointing else block_activation_bytes(m, FP32)
    return saved, b * t * (m.n_layers * per_layer + head_activation_bytes(m))


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("model", [
    ["model=tiny"],
    ["model=gpt2_124m", "model.n_layers=2", "data.seq_len=128"],
    ["model=llama3_1b", "model.n_layers=2", "model.d_model=256", "model.n_heads=8", "model.n_kv_heads=2",
     "model.ffn_hidden=512", "model.vocab_size=1000", "data.seq_len=128"],
])
def test_activation_estimate_is_within_15_percent_of_what_autograd_saves(model: list[str], ac: bool) -> None:
    measured, estimated = _saved_activation_bytes(["trainer.micro_batch_size=4", *model,
                                                   f"strategy.activation_checkpointing={str(ac).lower()}"])
    assert measured > 0
    assert abs(estimated - measured) / measured <= 0.15, (measured, estimated)


def test_70b_with_ddp_is_refused_naming_what_fits(tmp_path: Path) -> None:
    out = launch("+cluster=a100x16", "model=llama3_70b", "strategy=ddp", f"run.root={hq(tmp_path)}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model=llama3_70b with strategy=ddp does not fit: ")
    assert "use strategy=" in lines[0] and "launcher.force=true" in lines[0]
    assert list(tmp_path.iterdir()) == []
    # A dry run shows the plan it refuses, then the same one line, and writes nothing either.
    dry = launch("+cluster=a100x16", "model=llama3_70b", "strategy=ddp", "launcher.dry_run=true",
                 f"run.root={hq(tmp_path)}")
    assert dry.returncode == 2 and dry.stderr.strip().splitlines()[-1] == lines[0]
    assert "memory per rank:" in dry.stderr and "DOES NOT FIT" in dry.stderr
    assert list(tmp_path.iterdir()) == []
    # The change it names does fit.
    fix = lines[0].split("use ")[1].split(" (")[0].split()
    ok = launch("+cluster=a100x16", "model=llama3_70b", *fix, "launcher.dry_run=true", f"run.root={hq(tmp_path)}")
    assert ok.returncode == 0, ok.stderr


def test_auto_picks_a_strategy_that_fits_and_says_why(tmp_path: Path) -> None:
    out = launch("+cluster=a100x16", "model=llama3_70b", "strategy=auto", "launcher.dry_run=true",
                 f"run.root={hq(tmp_path)}")
    assert out.returncode == 0, out.stderr
    assert "ddp: " in out.stderr and "> 80.0 GB" in out.stderr and "picked " in out.stderr
    plan = json.loads(next(tmp_path.rglob("plan.json")).read_text())
    assert plan["fits"] and plan["strategy"] != "ddp"
    assert plan["memory_gb"]["total"] <= plan["capacity_gb"] == 80.0
    small = launch("+cluster=a100x16", "model=gpt2_124m", "strategy=auto", "launcher.dry_run=true",
                   f"run.root={hq(tmp_path)}")
    assert small.returncode == 0 and "strategy ddp (auto: picked ddp" in small.stderr


def test_one_gpu_auto_is_never_distributed(tmp_path: Path) -> None:
    out = launch("+cluster=a100x16", "cluster.nodes=1", "cluster.gpus_per_node=1", "model=gpt2_124m",
                 "strategy=auto", "launcher.dry_run=true", f"run.root={hq(tmp_path)}")
    assert out.returncode == 0, out.stderr
    assert "strategy single (auto: picked single" in out.stderr


def test_8b_locally_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    out = launch("model=llama3_8b", "local.nproc=2", f"run.root={hq(tmp_path)}")
    assert out.returncode == 2
    assert out.stderr.startswith("error: model=llama3_8b with strategy=ddp does not fit: ")
    assert "this host's available memory" in out.stderr and "launcher: started" not in out.stderr
    assert list(tmp_path.iterdir()) == []
    from launcher.plan.fit import host_available_bytes

    if host_available_bytes() < 140e9:  # offloading 8B's states keeps ~150 GB in the very memory the ranks use
        assert "zero3_offload" not in out.stderr, out.stderr


def test_offloading_on_a_cpu_host_keeps_the_offloaded_bytes_in_the_same_memory() -> None:
    """A CPU run's ranks compute in host memory: what zero3_offload moves "to the host" stays in it, so the fit
    counts both (the plan suggested zero3_offload for llama3_8b on a 24 GB host, with 150 GB offloaded)."""
    from launcher.plan.fit import Capacity, capacity, fits

    cfg = compose_config(["model=llama3_8b", "strategy=zero3_offload", "strategy.activation_checkpointing=true",
                          "trainer.micro_batch_size=1"])
    assert capacity(cfg, 1, 0).shared_host and not capacity(cfg, 1, 1).shared_host  # CPU ranks; a GPU rank
    est = estimate_memory(cfg, 1, 1, ModelShape.ours(cfg.model, count_parameters(cfg.model)), margin_bytes=0,
                          fragmentation=0)
    assert est.host > 100e9
    assert fits(est, Capacity(est.total + 1, "a GPU's memory"))  # the host is other memory, unchecked here
    assert not fits(est, Capacity(est.total + 1, "this host's memory", shared_host=True))
    assert fits(est, Capacity(est.total + est.host + 1, "this host's memory", shared_host=True))


def test_lr_scaling_needs_a_reference_batch() -> None:
    from contract.errors import ConfigError
    from launcher.compose import compose_and_plan

    with pytest.raises(ConfigError, match="optim.reference_batch_size"):
        compose_and_plan(["optim.lr_scaling=linear"])
    _, plan = compose_and_plan(["optim.lr_scaling=sqrt", "optim.reference_batch_size=4", "optim.lr=1e-3",
                                "trainer.global_batch_size=16", "local.nproc=2"])
    assert plan.lr == pytest.approx(2e-3)


def test_rope_tables_sized_by_max_seq_len_are_in_the_estimate() -> None:
    """RoPE's cos and sin buffers follow model.max_seq_len, not the parameters: a typed max_seq_len of 1e8 with a
    short data.seq_len planned 1.01 GB for a run that peaked at 9.2 GiB. The estimate grows by exactly the buffers
    the model builds (beside the states, which stay the parameters' own)."""
    from launcher.compose import compose_and_plan
    from train.model.transformer import build_model

    def planned(max_seq_len: int) -> tuple[float, float, int]:
        cfg, plan = compose_and_plan([f"model.max_seq_len={max_seq_len}", "data.seq_len=64", "strategy=ddp",
                                      "precision=fp32", "launcher.force=true"])
        assert plan.fit is not None
        buffers = sum(b.numel() * b.element_size() for b in build_model(cfg.model).buffers())
        assert buffers == 4 * max_seq_len * (cfg.model.d_model // cfg.model.n_heads)
        return plan.fit.estimate.temporary, plan.fit.estimate.states, buffers

    short, long = planned(64), planned(100_000)
    assert long[0] - short[0] == long[2] - short[2] > 6e6  # the tables' bytes, counted
    assert long[1] == short[1]


def test_a_share_under_a_tenth_of_a_gb_is_not_written_0_0() -> None:
    """The re-trial of issue 48: local.nproc=1000 read '1.0 GB per rank > 0.0 GB (this host's available memory /
    1000 local rank(s))'."""
    from launcher.plan.fit import GB, gb

    assert gb(0.023 * GB) == "0.023" and gb(10.74 * GB) == "10.7" and gb(0) == "0.0" and gb(0.1 * GB) == "0.1"
