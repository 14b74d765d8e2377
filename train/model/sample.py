"""Generate tokens from a checkpoint on one process: the weights consolidated as train/weights/export.py reads them (any
world size and strategy that wrote the checkpoint), loaded into the run's model built from the checkpoint's own
config. Run by launcher/sample.py, which checks the inputs first.

Our transformer has no key/value cache, so each new token re-runs the forward over the context (the last
model.max_seq_len tokens, as nanoGPT crops it): fine for the short generations this is for, eyeballing a model.
"""

from __future__ import annotations

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


def load_model(step_dir: Path, model_cfg: Any, device: torch.device) -> nn.Module:
    """The run's model with the checkpoint's weights, in eval mode. A tied weight may be saved under one of its
    names only (DeepSpeed's consolidation); any other missing or unexpected name is refused."""
    model = build_model(model_cfg)
    missing, unexpected = model.load_state_dict(load_model_state(step_dir), strict=False)
    tensors = model.state_dict(keep_vars=True)
    loaded = {tensors[name].data_ptr() for name in tensors if name not in missing}
    untied = [name for name in missing if tensors[name].data_ptr() not in loaded]
    if untied or unexpected:
        raise ValueError(f"the checkpoint at {step_dir} does not fit the model its config builds: missing "
                         f"{untied[:5]}, unexpected {list(unexpected)[:5]}")
    return model.to(device).eval()


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


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], sampling: Sampling, context: int) -> list[int]:
    """The new ids after `prompt` (at most max_new_tokens; ends with stop_id when that came)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(sampling.seed)
    ids = list(prompt)
    new: list[int] = []
    for _ in range(sampling.max_new_tokens):
        window = torch.tensor([ids[-context:]], dtype=torch.long, device=device)
        token = next_token(logits_of(model(window))[0, -1], sampling, generator)
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
