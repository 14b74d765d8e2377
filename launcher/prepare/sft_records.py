"""Supervised fine-tuning records read from JSON Lines (--prompt-field/--response-field or --messages-field) and
tokenized as segments with their loss mask (contract/data/sft.py says what the segments and the mask are).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from contract.data.sft import (
    RECORD_START,
    RESPONSE,
    BadRecord,
    ChatTemplate,
    Segments,
    chat_segments,
    chat_template,
    messages_of,
    prompt_response_segments,
)
from contract.errors import ConfigError
from launcher.prepare.documents import _lines
from launcher.prepare.inputs import BadInput, InputFile, _first_line, _leave_out, _open, _read_errors
from launcher.prepare.plan import Options, Plan
from launcher.prepare.tokenizer import Encoder

FLAGS = "--prompt-field/--response-field or --messages-field"


def check_sft_options(options: Options, template: ChatTemplate | None, tokenizer_name: str,
                      inputs: list[InputFile]) -> None:
    """Refuse, before anything is written, options that can't make supervised fine-tuning records."""
    pair = (options.prompt_field, options.response_field)
    if options.messages_field is None and pair == (None, None):
        return
    if options.messages_field is not None and pair != (None, None):
        raise ConfigError("--messages-field and --prompt-field/--response-field are two record formats: give one")
    if options.messages_field is None and None in pair:
        missing = "--response-field" if options.response_field is None else "--prompt-field"
        raise ConfigError(f"prompt/response records need both fields: add {missing} NAME")
    if options.messages_field is not None and template is None:
        raise ConfigError(f"--messages-field renders chats with the tokenizer's chat template, and {tokenizer_name} "
                          "has none (no chat_template.jinja, nor a chat_template in a tokenizer_config.json, beside its tokenizer.json): add "
                          "one, or give --prompt-field/--response-field records")
    if options.text_per_line or options.text_field != "text":
        raise ConfigError(f"--text-field and --text-per-line read plain text, not {FLAGS} records: drop them")
    for file in inputs:
        if file.kind != "jsonl":
            raise BadInput(f"{file.path} is not JSON Lines, and {FLAGS} records are read from JSON Lines "
                           f"(.jsonl): convert it, or {_leave_out(file)}")
    for file in inputs:  # every record checked before anything is written (a second read: records are small)
        for _ in read_records(file, options, template):
            pass


def template_of(plan: Plan) -> ChatTemplate | None:
    """The chat template the plan renders with (None: raw prompt/response text); refused when it changed since."""
    if plan.options.chat_template is None:
        return None
    template = chat_template(plan.tokenizer.info.path)
    if template is None or template.sha256 != plan.options.chat_template:
        raise ConfigError(f"the chat template beside {plan.tokenizer.info.path} changed during the preparation: "
                          "prepare again with --overwrite")
    return template


def record_segments(record: Any, options: Options, template: ChatTemplate | None) -> Segments:
    if options.messages_field is not None:
        assert template is not None
        return chat_segments(messages_of(record, options.messages_field), template)
    assert options.prompt_field is not None and options.response_field is not None
    return prompt_response_segments(record, options.prompt_field, options.response_field, template)


def read_records(file: InputFile, options: Options, template: ChatTemplate | None) -> Iterator[Segments]:
    """The file's records as segments; BadInput names the file, the line and the fix."""
    try:
        with _open(file) as raw:
            for lineno, line in enumerate(_lines(raw), 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
                    raise BadInput(f"{file.path} line {lineno} is not JSON ({_first_line(err)}): fix the line, "
                                   f"or {_leave_out(file)}") from None
                try:
                    yield record_segments(record, options, template)
                except BadRecord as err:
                    raise BadInput(f"{file.path} line {lineno} {err}: fix or drop the record, or name the "
                                   f"fields with {FLAGS}") from None
    except _read_errors() as err:
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or {_leave_out(file)}") from None


def encode_records(records: list[Segments], encoder: Encoder, eod_id: int,
                   dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, tokens per record) of the records, each followed by the end-of-document id (a response token:
    it ends the answer). Every segment is encoded in one batch call, special tokens read as such (a template's
    turn markers)."""
    texts = [text for segments in records for text, _ in segments]
    body, lengths = encoder.encode_with_specials(texts)
    is_response = np.fromiter((r for segments in records for _, r in segments), bool, len(texts))
    per_record = np.fromiter((len(s) for s in records), np.int64, len(records))
    seg_ends = np.cumsum(per_record)
    record_body = np.add.reduceat(lengths, seg_ends - per_record) if len(records) else np.zeros(0, np.int64)
    token_response = np.repeat(is_response, lengths)
    sizes = record_body + 1
    ends = np.cumsum(sizes) - 1
    ids = np.empty(int(sizes.sum()), dtype=dtype)
    mask = np.zeros(len(ids), dtype=np.uint8)
    is_body = np.ones(len(ids), dtype=bool)
    is_body[ends] = False
    ids[is_body], ids[ends] = body, eod_id
    mask[is_body] = np.where(token_response, RESPONSE, 0)
    mask[ends] = RESPONSE
    mask[ends - record_body] |= RECORD_START
    return ids, mask, sizes
