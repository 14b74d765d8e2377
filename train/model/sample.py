"""Generate tokens from a checkpoint on one process: the weights consolidated as train/weights/export.py reads them (any
world size and strategy that wrote the checkpoint), loaded into the run's model built from the checkpoint's own
config. Run by launcher/sample.py, which checks the inputs first.

Each new token runs the model over that token alone, its attention reading the keys and values of the positions
before it from a cache (Context): our transformer's KVCache (train/model/transformer.py), a Hugging Face model's
own past_key_values. A model of the user's own without a cache, and any model once the text outgrows the context
(model.max_seq_len: the window then slides, and positions move), re-runs the whole window, the last
model.max_seq_len tokens as nanoGPT crops them, for every token, as without a cache (Sampling.cache=False):
the same logits, so greedy output is the same either way.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from train.model.build import build_model, logits_of
from train.weights.export import load_model_state


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: the whole vocabulary
    seed: int = 0
    stop_id: int | None = None  # generation ends after this id (the run's end-of-document id)
    cache: bool = True  # False: re-run the whole window for every new token (launcher.sample --no-cache)


def load_model(step_dir: Path, model_cfg: Any, device: torch.device) -> nn.Module:
    """The run's model with the checkpoint's weights, in eval mode."""
    return with_weights(model_cfg, load_model_state(step_dir), f"the checkpoint at {step_dir}").to(device).eval()


def with_weights(model_cfg: Any, state: dict[str, torch.Tensor], what: str) -> nn.Module:
    """The run's model built from its config, holding `state` (`what` names it in the error). A tied weight may
    be saved under one of its names only (DeepSpeed's consolidation); any other missing or unexpected name is
    refused."""
    model = build_model(model_cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tensors = model.state_dict(keep_vars=True)
    loaded = {tensors[name].data_ptr() for name in tensors if name not in missing}
    untied = [name for name in missing if tensors[name].data_ptr() not in loaded]
    if untied or unexpected:
        raise ValueError(f"{what} does not fit the model its config builds: missing {untied[:5]}, unexpected "
                         f"{list(unexpected)[:5]}")
    return model


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """One id from the last position's logits: argmax when greedy, else a draw from softmax(logits / T) over
    the top k."""
    if sampling.temperature == 0:
        return int(logits.argmax())
    scaled = logits.float() / sampling.temperature
    if 0 < sampling.top_k < scaled.numel():
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


class Context:
    """The last position's logits for the ids so far. Without a cache: the model over the window (the last
    `context` ids). With one: over the ids the cache has not seen, while they fit the context; past it the window
    slides, every position moves, and the whole window is run again."""

    def __init__(self, model: nn.Module, context: int, cache: bool) -> None:
        from train.model.transformer import KVCache, Transformer

        self.model, self.context = model, context
        self.ours = cache and isinstance(model, Transformer)
        self.hf = cache and not self.ours and callable(getattr(model, "prepare_inputs_for_generation", None))
        self.cache: Any = KVCache(context) if self.ours else None
        # Hugging Face's name for it: `cache` in transformers 5.2x, `past_key_values` before (still taken, deprecated).
        self.hf_name = "cache" if self.hf and "cache" in inspect.signature(model.forward).parameters else \
            "past_key_values"
        self.seen = 0
        self.device = next(model.parameters()).device

    def logits(self, ids: list[int]) -> torch.Tensor:
        if (self.ours or self.hf) and len(ids) <= self.context:
            new = torch.tensor([ids[self.seen:]], dtype=torch.long, device=self.device)
            self.seen = len(ids)
            if self.ours:
                return logits_of(self.model(new, cache=self.cache))[0, -1]
            out = self.model(input_ids=new, use_cache=True, **{self.hf_name: self.cache})
            self.cache = getattr(out, self.hf_name)
            return out.logits[0, -1]
        window = torch.tensor([ids[-self.context:]], dtype=torch.long, device=self.device)
        return logits_of(self.model(window))[0, -1]


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], sampling: Sampling, context: int) -> list[int]:
    """The new ids after `prompt` (at most max_new_tokens; ends with stop_id when that came)."""
    generator = torch.Generator().manual_seed(sampling.seed)
    ids = list(prompt)
    new: list[int] = []
    window = Context(model, context, sampling.cache)
    for _ in range(sampling.max_new_tokens):
        token = next_token(window.logits(ids), sampling, generator)
        ids.append(token)
        new.append(token)
        if token == sampling.stop_id:
            break
    return new


def sample(step_dir: Path, model_cfg: Any, prompt: list[int], sampling: Sampling) -> list[int]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(sampling.seed)
    model = load_model(step_dir, model_cfg, device)
    return generate(model, prompt, sampling, int(model_cfg.max_seq_len))
