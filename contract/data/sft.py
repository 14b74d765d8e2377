"""Supervised fine-tuning records: a prompt/response record or a chat, as text segments that count in the loss or
not, and the loss mask a prepared dataset keeps beside its tokens. Torch-free: launcher.prepare writes with it,
launcher.sample renders prompts with it, the ranks read the masks it describes.

A record is a list of (text, is_response) segments, each tokenized on its own (so a prompt's tokens never merge
with its response's, and the prompt a user gives launcher.sample encodes as training saw it); the end-of-document
id after the record counts as a response token (it teaches the model to end its answer). A chat is rendered with
the tokenizer's chat template (chat_template.jinja or tokenizer_config.json's `chat_template`, Jinja as Hugging
Face renders it): each assistant turn is what the template adds between the conversation rendered up to it with the generation prompt
and the conversation rendered with it. A prompt/response record is a one-turn chat when the tokenizer has a
template, else the prompt's text followed by the response's.

The mask shard beside train/NNNNN.bin is train/NNNNN.mask: one uint8 per token, bit RESPONSE set on a token that
counts in the loss (as a target) and in the run's `tokens`, bit RECORD_START on a record's first token (a padded
sample is one record).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import ConfigError

MASK_SUFFIX = ".mask"
MASK_DTYPE = "uint8"
RESPONSE = 1
RECORD_START = 2
LAYOUTS = ("packed", "padded")  # data.sft_layout

Segments = list[tuple[str, bool]]


class BadRecord(ValueError):
    """A record that can't be a training example: the message names what is missing (the caller adds where)."""


def mask_path(shard_path: str) -> str:
    """train/00000.bin -> train/00000.mask"""
    return shard_path[: -len(".bin")] + MASK_SUFFIX if shard_path.endswith(".bin") else shard_path + MASK_SUFFIX


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the tokenizer_config.json it came from
    template: str
    tokens: dict[str, str]  # bos_token, eos_token, ... as the template reads them

    @property
    def sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.template.encode()).hexdigest()

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return str(_compiled(self.template).render(messages=list(messages),
                                                       add_generation_prompt=add_generation_prompt, **self.tokens))
        except Exception as err:  # jinja2's TemplateError, raise_exception's, or the template's own TypeError
            raise BadRecord(f"the chat template of {self.source} fails on it ({str(err).splitlines()[0][:160]})") \
                from None

    def prompt(self, user_text: str) -> str:
        """What launcher.sample --chat continues: one user turn and the template's generation prompt."""
        return self.render([{"role": "user", "content": user_text}], add_generation_prompt=True)


_CACHE: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    if template not in _CACHE:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        # As transformers' apply_chat_template renders: trim_blocks, lstrip_blocks, tojson, raise_exception.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        _CACHE[template] = env.from_string(template)
    return _CACHE[template]


def chat_template(tokenizer_json: str | None) -> ChatTemplate | None:
    """The chat template beside a tokenizer.json, found as transformers finds it: a chat_template.jinja file
    (what save_pretrained writes since transformers 4.49), else tokenizer_config.json's `chat_template` (a
    template list, Hugging Face's named templates, gives its `default`). None: bytes, or neither holds one. The
    special tokens come from tokenizer_config.json."""
    if tokenizer_json is None:
        return None
    directory = Path(tokenizer_json).parent
    config, jinja = directory / "tokenizer_config.json", directory / "chat_template.jinja"
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    source, template = config, raw.get("chat_template")
    if jinja.is_file():
        try:
            source, template = jinja, jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        return None
    return ChatTemplate(str(source), template, _special_tokens(raw))


SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _special_tokens(raw: dict[str, Any]) -> dict[str, str]:
    tokens = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = raw.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        tokens[key] = value if isinstance(value, str) else ""
    return tokens


def special_tokens(tokenizer_json: str | None) -> dict[str, str]:
    """bos_token, eos_token, pad_token, unk_token as the tokenizer_config.json beside a tokenizer.json names them
    ("" where it names none, or has no such file)."""
    raw: Any = {}
    if tokenizer_json is not None:
        try:
            raw = json.loads((Path(tokenizer_json).parent / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
    return _special_tokens(raw if isinstance(raw, dict) else {})


def _text(record: dict[str, Any], field: str, what: str) -> str:
    if field not in record:
        raise BadRecord(f"has no field {field!r} (it has {', '.join(map(repr, record)) or 'none'})")
    value = record[field]
    if not isinstance(value, str):
        raise BadRecord(f"field {field!r} is {type(value).__name__}, not text")
    if not value.strip():
        raise BadRecord(f"field {field!r} (the {what}) is empty")
    return value


def prompt_response_segments(record: Any, prompt_field: str, response_field: str,
                             template: ChatTemplate | None) -> Segments:
    if not isinstance(record, dict):
        raise BadRecord(f"is a JSON {type(record).__name__}, not an object with {prompt_field!r} and "
                        f"{response_field!r}")
    prompt = _text(record, prompt_field, "prompt")
    response = _text(record, response_field, "response")
    if template is None:
        return [(prompt, False), (response, True)]
    return chat_segments([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], template)


def messages_of(record: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(record, dict) or field not in record:
        keys = ", ".join(map(repr, record)) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        raise BadRecord(f"has no field {field!r} (it has {keys or 'none'})")
    messages = record[field]
    if not isinstance(messages, list) or not messages:
        raise BadRecord(f"field {field!r} is not a list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRecord(f"message {i} of {field!r} is not {{\"role\": ..., \"content\": \"...\"}}")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord(f"{field!r} has no assistant turn (nothing to learn from)")
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and not m["content"].strip():
            raise BadRecord(f"message {i} of {field!r} (an assistant turn) is empty")
    return messages


def chat_segments(messages: list[dict[str, Any]], template: ChatTemplate) -> Segments:
    """The rendered chat cut at each assistant turn's start and end. A template whose rendering of a shorter
    conversation is not the start of a longer one's can't be cut so: refused."""
    segments: Segments = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True)
        upto = template.render(messages[: i + 1], add_generation_prompt=False)
        if not before.startswith(done) or not upto.startswith(before):
            raise BadRecord(f"the chat template of {template.source} renders a conversation that does not start "
                            "with its earlier turns' rendering, so assistant turns can't be told apart")
        segments += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    whole = template.render(messages, add_generation_prompt=False)
    if not whole.startswith(done):
        raise BadRecord(f"the chat template of {template.source} renders the whole conversation differently from "
                        "its turns")
    segments.append((whole[len(done):], False))
    if not any(text.strip() for text, response in segments if response):
        raise BadRecord("its assistant turns render as nothing")
    return [(text, response) for text, response in segments if text]


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ConfigError(f"data.sft_layout={layout} is not a layout: give packed (records one after another in "
                          "windows of data.seq_len) or padded (one record a sample, padded or cut to data.seq_len)")


@dataclass(frozen=True)
class PaddedCut:
    """What data.sft_layout=padded keeps of a split at a seq_len: each record is one sample of seq_len + 1 tokens,
    a longer one cut, so response tokens past the cut never train."""

    records: int
    response_tokens: int  # that count as targets (not a record's first token)
    kept: int  # of those, within a sample's seq_len + 1 tokens
    longest: int  # tokens of the longest record

    @property
    def share(self) -> float:
        return self.kept / max(1, self.response_tokens)


def padded_cut(mask_files: Sequence[Path], seq_len: int) -> PaddedCut:
    """Read from the loss-mask shards (a byte a token, as the ranks read them to find the records)."""
    import numpy as np

    mask = np.concatenate([np.fromfile(f, dtype=np.uint8) for f in mask_files]) if mask_files else np.zeros(0, np.uint8)
    starts = np.flatnonzero(mask & RECORD_START)
    if len(starts) == 0:
        return PaddedCut(0, 0, 0, 0)
    response = np.flatnonzero(mask & RESPONSE)
    offset = response - starts[np.searchsorted(starts, response, side="right") - 1]
    counted = offset >= 1  # a record's first token is no target
    return PaddedCut(len(starts), int(counted.sum()), int((counted & (offset <= seq_len)).sum()),
                     int(np.diff(np.append(starts, mask.size)).max()))
