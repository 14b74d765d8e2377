"""Generation with a key/value cache (issue 30, item 6): our transformer's attention reads the cached keys and values
(train/model/transformer.py KVCache), a Hugging Face model its own cache, a user's model without one the whole window;
the logits, and so greedy output, are those of the full-window forward; each new token is run alone. launcher.sample
with and without the cache on a trained run: tests/dist/test_sample.py; the speed: python -m bench sample_cache."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from contract.config.training import ModelConfig
from train.model.sample import Context, Sampling, generate
from train.model.transformer import KVCache, Transformer

SHAPES = {
    "llama": {},
    "gpt2": {"position": "learned", "mlp": "gelu", "norm": "layernorm"},
    "gqa": {"n_kv_heads": 2},
}


def ours(shape: str, context: int = 32) -> Transformer:
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), {"name": "t", "vocab_size": 97, "d_model": 32,
                                                              "n_layers": 2, "n_heads": 4, "ffn_hidden": 64,
                                                              "max_seq_len": context, **SHAPES[shape]})
    torch.manual_seed(0)
    return Transformer(cfg).eval()


def count_positions(model: nn.Module) -> list[int]:
    """The positions each forward of `model` runs over, appended as it runs."""
    runs: list[int] = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tokens = args[0] if args else kwargs["input_ids"]
        runs.append(int(tokens.shape[1]))

    model.register_forward_pre_hook(before, with_kwargs=True)
    return runs


class UserLM(nn.Module):
    """A model of a user's own: forward(tokens) only, no cache."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ours("llama", context=16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(tokens)


@pytest.mark.parametrize("shape", list(SHAPES))
@torch.no_grad()
def test_cached_logits_are_the_full_forwards(shape: str) -> None:
    model = ours(shape)
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    full = model(tokens)
    cache = KVCache(32)
    # A prompt, then several new positions at once (each sees the cache and the new ones up to itself), then one at a time.
    parts = [model(tokens[:, :7], cache=cache), model(tokens[:, 7:12], cache=cache)]
    parts += [model(tokens[:, i:i + 1], cache=cache) for i in range(12, 20)]
    assert cache.length == 20
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="holds 32 positions and 33 were asked for"):
        model(torch.zeros(2, 13, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_output_is_the_same_with_and_without_the_cache_past_the_context(shape: str) -> None:
    model = ours(shape, context=16)
    prompt = [5, 17, 42]
    cached, full = (generate(model, prompt, Sampling(40, cache=cache), 16) for cache in (True, False))
    assert cached == full and len(cached) == 40  # 43 ids: the window slides from id 17 on
    sampled = [generate(model, prompt, Sampling(40, temperature=1.5, top_k=20, seed=3, cache=cache), 16)
               for cache in (True, False)]
    assert sampled[0] == sampled[1]


def test_each_new_token_runs_alone_while_it_fits_the_context() -> None:
    model = ours("llama", context=16)
    runs = count_positions(model)
    generate(model, [1, 2, 3], Sampling(16), 16)
    assert runs == [3] + [1] * 13 + [16, 16]  # the prompt once, one position per token; past 16 ids the window
    runs.clear()                                  # slides (every position moves): the whole window again
    generate(model, [1, 2, 3], Sampling(10, cache=False), 16)
    assert runs == list(range(3, 13))
    user = UserLM()
    assert not Context(user, 16, cache=True).ours and not Context(user, 16, cache=True).hf
    runs = count_positions(user)
    assert generate(user, [1, 2, 3], Sampling(10), 16) == generate(user.inner, [1, 2, 3], Sampling(10), 16)
    assert runs[:10] == list(range(3, 13))  # a model without a cache: the whole window, every token


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_hugging_face_model_reads_its_own_cache(family: str) -> None:
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, vocab_size=97,
                                          max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert Context(model, 32, cache=True).hf
    calls = count_positions(model)
    cached = generate(model, [1, 2, 3], Sampling(40), 32)
    assert calls[:3] == [3, 1, 1]
    assert cached == generate(model, [1, 2, 3], Sampling(40, cache=False), 32)
