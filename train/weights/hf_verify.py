"""An export proves itself before it is called done (OLMo-core's validate_conversion, made stricter): the written
directory is loaded as a user loads it, with `AutoModelForCausalLM.from_pretrained`, and compared with slurmtrain's
own model holding the same weights.

    logits   on fixed prompts (seeded ids), both in float32 on the weights as written (an export in bfloat16 is
             compared on those bfloat16 values, upcast): what remains is summation order, so the tolerance is
             float32's, scaled by the logits' size. A wrong RoPE permutation moves even an untrained model's
             logits some 10,000 times further (measured: 5e-3 against 2e-7)
    greedy   the continuation of each prompt, 32 tokens (fewer when the context is shorter): Hugging Face's
             generate() with its key/value cache against slurmtrain's sampling loop (train/model/sample.py)
    loading  no weight missing, unexpected or of another shape (from_pretrained fills those at random)
    tokenizer  AutoTokenizer.from_pretrained(DIR) encodes a fixed text as the run's tokenizer does
    chat     with a chat template: apply_chat_template of one user turn and the generation prompt gives the ids
             `launcher.sample --chat` encodes (contract/data/sft.py renders it)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contract.data.run_tokenizer import RunTokenizer
from train.model.build import logits_of
from train.model.sample import Sampling, generate

PROMPTS, PROMPT_TOKENS, GREEDY_TOKENS = 3, 64, 32
REL_TOLERANCE = 1e-4  # of the largest |logit|, at least 1e-4 absolute
TEXT = "Models that leave and come in: héllo wörld ✓ 1234\n\tdef f(x):\n        return x  # done?"


class ExportMismatch(ValueError):
    """The written directory does not reproduce slurmtrain's model; the message says by how much."""


@dataclass(frozen=True)
class Verified:
    max_difference: float
    tolerance: float
    prompts: int
    prompt_tokens: int
    greedy_tokens: int
    tokenizer: bool
    chat: bool = False

    def describe(self) -> str:
        tokenizer = "; AutoTokenizer encodes as the run's tokenizer" if self.tokenizer else ""
        chat = "; the chat template renders as launcher.sample --chat encodes" if self.chat else ""
        return (f"verified: logits within {self.max_difference:.1e} of slurmtrain's (tolerance {self.tolerance:.1e}) "
                f"on {self.prompts} prompts of {self.prompt_tokens} tokens; greedy continuations of "
                f"{self.greedy_tokens} tokens identical{tokenizer}{chat}")


def prompts(vocab_size: int, length: int) -> torch.Tensor:
    """The fixed prompts: ids drawn with a fixed seed, the same for every export."""
    return torch.randint(0, vocab_size, (PROMPTS, length), generator=torch.Generator().manual_seed(29))


def load_export(directory: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32, output_loading_info=True)
    model, info = loaded
    wrong = {kind: sorted(map(str, info.get(kind) or [])) for kind in ("missing_keys", "unexpected_keys",
                                                                       "mismatched_keys")}
    wrong = {kind: names for kind, names in wrong.items() if names}
    if wrong:
        kind, names = next(iter(wrong.items()))
        raise ExportMismatch(f"from_pretrained finds {kind.replace('_', ' ')} {names[:3]}"
                             f"{f' and {len(names) - 3} more' if len(names) > 3 else ''}")
    return model.eval()  # type: ignore[no-any-return]


def _hf_greedy(model: nn.Module, prompt: torch.Tensor, new: int) -> list[int]:
    from transformers import GenerationConfig

    ids = prompt.unsqueeze(0)
    # No end of sequence here: all `new` tokens are compared (the export's own generation_config stops at it, and
    # generate() merges that one's eos_token_id into any it is given).
    model.generation_config.eos_token_id = None  # type: ignore[union-attr]
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)  # type: ignore[operator]
    return [int(i) for i in out[0, ids.shape[1]:]]


def compare_logits(reference: nn.Module, exported: nn.Module, ids: torch.Tensor) -> tuple[float, float]:
    """(the largest |difference| of the logits, the tolerance); ExportMismatch past it, naming where."""
    ours = logits_of(reference(ids)).float()
    theirs = logits_of(exported(ids)).float()
    if ours.shape != theirs.shape:
        raise ExportMismatch(f"the logits are {list(theirs.shape)} from Hugging Face and {list(ours.shape)} from "
                             "slurmtrain's model")
    difference = (ours - theirs).abs()
    worst = float(difference.max())
    tolerance = REL_TOLERANCE * max(1.0, float(ours.abs().max()))
    if not worst <= tolerance:  # NaN fails too
        prompt, position, _ = (int(i) for i in torch.nonzero(difference == difference.max())[0])
        raise ExportMismatch(f"the logits differ by up to {worst:.3g} (tolerance {tolerance:.1e}; first at prompt "
                             f"{prompt}, position {position}; largest |logit| {float(ours.abs().max()):.3g})")
    return worst, tolerance


def compare_greedy(reference: nn.Module, exported: nn.Module, ids: torch.Tensor, new: int, context: int) -> None:
    for i, prompt in enumerate(ids):
        ours = generate(reference, prompt.tolist(), Sampling(max_new_tokens=new), context)
        theirs = _hf_greedy(exported, prompt, new)
        if ours != theirs:
            at = next((j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours),
                                                                                                     len(theirs)))
            raise ExportMismatch(f"the greedy continuation of prompt {i} differs at new token {at} (slurmtrain: "
                                 f"{ours[at:at + 4]}..., Hugging Face: {theirs[at:at + 4]}...)")


def compare_tokenizer(directory: Path, run: RunTokenizer) -> bool:
    """AutoTokenizer against the run's tokenizer, and its chat template (when the run's has one) against
    launcher.sample --chat's prompt; True when a chat was compared."""
    from transformers import AutoTokenizer

    from contract.data.sft import BadRecord, chat_template

    loaded = AutoTokenizer.from_pretrained(str(directory))
    theirs = loaded.encode(TEXT, add_special_tokens=False)
    ours = run.encode(TEXT)
    if list(theirs) != ours:
        raise ExportMismatch(f"AutoTokenizer encodes {TEXT[:20]!r}... as {list(theirs)[:6]}..., the run's tokenizer "
                             f"as {ours[:6]}...")
    template = chat_template(run.path)
    if template is None:
        return False
    try:
        ours = run.encode(template.prompt(TEXT))
    except (BadRecord, ValueError):  # a template that refuses a lone user turn: launcher.sample --chat refuses too
        return False
    if getattr(loaded, "chat_template", None) is None:
        raise ExportMismatch("AutoTokenizer finds no chat template in the export, and the run's tokenizer has one")
    theirs = loaded.apply_chat_template([{"role": "user", "content": TEXT}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    if list(theirs) != ours:
        at = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), min(len(theirs),
                                                                                                 len(ours)))
        raise ExportMismatch(f"apply_chat_template encodes a user turn as {list(theirs)[at:at + 6]}... from id {at}, "
                             f"launcher.sample --chat as {ours[at:at + 6]}...")
    return True


@torch.no_grad()
def verify(reference: nn.Module, directory: Path, vocab_size: int, max_seq_len: int,
           tokenizer: RunTokenizer | None) -> Verified:
    """Compare the export in `directory` with `reference` (slurmtrain's model holding the weights as written, in
    float32, eval mode); ExportMismatch saying by how much when they differ."""
    exported = load_export(directory)
    length = min(PROMPT_TOKENS, max_seq_len)
    worst, tolerance = compare_logits(reference, exported, prompts(vocab_size, length))
    new = min(GREEDY_TOKENS, max_seq_len - 1)
    start = prompts(vocab_size, max(1, min(8, max_seq_len - new)))
    compare_greedy(reference, exported, start, new, max_seq_len)
    chat = compare_tokenizer(directory, tokenizer) if tokenizer is not None else False
    return Verified(worst, tolerance, PROMPTS, length, new, tokenizer is not None, chat)


def quiet_transformers() -> Any:
    """transformers' progress bars and advice off (an export prints its own lines)."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    return logging
