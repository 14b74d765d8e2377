from __future__ import annotations

import pytest
import torch

from launcher.compose import compose_config
from launcher.plan.cross_checks import count_parameters
from train.model.transformer import build_model

MODELS = ["tiny", "gpt2_124m", "gpt2_350m", "llama3_1b", "llama3_8b", "llama3_70b"]


@pytest.mark.parametrize("model", MODELS)
def test_planner_parameter_count_matches_the_model(model: str) -> None:
    cfg = compose_config([f"model={model}"]).model
    with torch.device("meta"):
        m = build_model(cfg)
    # Tied embeddings are one tensor: count unique parameters.
    actual = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    assert count_parameters(cfg) == actual


def test_llama3_8b_has_the_published_size() -> None:
    assert 8.0e9 < count_parameters(compose_config(["model=llama3_8b"]).model) < 8.1e9


@pytest.mark.parametrize("overrides", [[], ["model.position=learned", "model.mlp=gelu", "model.norm=layernorm"],
                                       ["model.n_kv_heads=2"]])
def test_model_is_causal(overrides: list[str]) -> None:
    torch.manual_seed(0)
    model = build_model(compose_config(["model=tiny", *overrides]).model).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 16, 256)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_tables_built_by_chunks_equal_the_whole_outer_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """rope_tables fills cos and sin a chunk of positions at a time (no third table of angles at its peak); the
    values are bit for bit those of the outer product of every position at once."""
    import train.model.transformer as transformer

    monkeypatch.setattr(transformer, "ROPE_CHUNK", 7)
    for seq_len, head_dim, theta in ((1, 8, 10000.0), (50, 16, 10000.0), (1000, 64, 500000.0)):
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        cos, sin = transformer.rope_tables(seq_len, head_dim, theta)
        assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin()), seq_len
