"""The tokenizer: a local Hugging Face tokenizer.json (or a directory holding one), or `bytes`.

`bytes` needs no tokenizer: a document's UTF-8 bytes are its ids 0..255 and the end-of-document id is 256, so its
vocabulary is 257. A Hugging Face tokenizer is loaded with the `tokenizers` library from a local file (nothing is
downloaded) and documents are encoded without the tokenizer's own special tokens (no BOS/EOS added around each
document): the end-of-document id is appended after every document instead, and a special token's text inside a
document ("<|endoftext|>" quoted in a page) is encoded as the text it is, so only the preparation puts that id in
the stream. The end-of-document id is `--eod-token` when given,
else the `eos_token` of a tokenizer_config.json beside tokenizer.json, else the first of EOD_CANDIDATES the
vocabulary holds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from contract.data.manifest import TokenizerInfo, dtype_for_vocab
from contract.data.run_tokenizer import BYTES
from contract.errors import ConfigError

BYTES_EOD = 256
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|end|>")
_HINT = "give a local tokenizer.json, a directory holding one, or `bytes` (nothing is downloaded)"


@dataclass(frozen=True)
class TokenizerChoice:
    """What the preparation encodes with: recorded in the plan, reloaded by every worker."""

    info: TokenizerInfo
    eod_id: int
    eod_token: str  # the token's text ("" for bytes)
    eod_from: str  # how it was chosen: "--eod-token", "tokenizer_config.json", "the vocabulary", "bytes"

    @property
    def dtype(self) -> str:
        return dtype_for_vocab(self.info.vocab_size)

    def describe(self) -> str:
        if self.eod_from == BYTES:
            return f"bytes (vocabulary 257: UTF-8 bytes 0-255, end of document id {self.eod_id})"
        return (
            f"{self.info.name} (vocabulary {self.info.vocab_size}, end of document {self.eod_token!r} = id "
            f"{self.eod_id}, from {self.eod_from})"
        )


class Encoder(Protocol):
    def encode(self, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The documents' ids concatenated (the dataset's dtype) and how many each document has."""

    def encode_with_specials(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """As encode, with a special token's text read as that token (a chat template's turn markers)."""


def load_tokenizer(spec: str, eod_token: str | None = None) -> TokenizerChoice:
    """Resolve `spec` (`bytes`, a tokenizer.json or a directory holding one) and its end-of-document id; a
    ConfigError names the fix when it is not a tokenizer."""
    if spec == BYTES:
        if eod_token is not None:
            raise ConfigError(
                f"--eod-token does not apply to --tokenizer bytes (its end of document is id "
                f"{BYTES_EOD}): leave --eod-token out"
            )
        return TokenizerChoice(TokenizerInfo(BYTES, None, 257, BYTES), BYTES_EOD, "", BYTES)
    path = Path(spec).expanduser()
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(
                f"tokenizer directory {path} holds no tokenizer.json (a fast tokenizer saved with "
                f"save_pretrained has one): {_HINT}"
            )
    elif path.is_file():
        file = path
    else:
        raise ConfigError(f"tokenizer {spec} does not exist: {_HINT}")
    file = file.resolve()
    tokenizer = _load(file)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
    eod_id, token, origin = _eod(tokenizer, file, eod_token)
    name = file.parent.name if file.name == "tokenizer.json" else file.name
    fingerprint = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
    return TokenizerChoice(TokenizerInfo(name, str(file), vocab_size, fingerprint), eod_id, token, origin)


def _load(file: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises plain Exception for any malformed file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{file} is not a Hugging Face tokenizer.json ({reason[:160]}): {_HINT}") from None


def _eod(tokenizer: Any, file: Path, eod_token: str | None) -> tuple[int, str, str]:
    if eod_token is not None:
        eod_id = tokenizer.token_to_id(eod_token)
        if eod_id is None:
            raise ConfigError(
                f"tokenizer {file} has no token {eod_token!r}: name one of its tokens with --eod-token"
            )
        return eod_id, eod_token, "--eod-token"
    configured = _configured_eos(file.parent / "tokenizer_config.json")
    if configured is not None and tokenizer.token_to_id(configured) is not None:
        return tokenizer.token_to_id(configured), configured, "tokenizer_config.json"
    for candidate in EOD_CANDIDATES:
        eod_id = tokenizer.token_to_id(candidate)
        if eod_id is not None:
            return eod_id, candidate, "the vocabulary"
    raise ConfigError(
        f"tokenizer {file} has no end-of-document token (none of {', '.join(EOD_CANDIDATES)}): "
        f"name the token that ends a document with --eod-token"
    )


def _configured_eos(path: Path) -> str | None:
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


class BytesEncoder:
    def __init__(self, dtype: str) -> None:
        self.dtype = np.dtype(dtype).newbyteorder("<")

    def encode(self, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        data = [d.encode("utf-8") for d in documents]
        lengths = np.fromiter(map(len, data), np.int64, len(data))
        return np.frombuffer(b"".join(data), dtype=np.uint8).astype(self.dtype), lengths

    encode_with_specials = encode


class HFEncoder:
    """encode_batch over the whole batch (the tokenizer's Rust threads), then one flat array of ids.

    A special token's text inside a document ("<|endoftext|>" quoted in a web page) is text, not the end of a
    document: a batch whose ids hold a special token's id (only such text puts one there) is encoded again with
    `encode_special_tokens` on (tokenizers >= 0.19), which encodes that text as the characters it is made of.
    Other batches, nearly all, skip that mode: it costs some 8% more time."""

    def __init__(self, path: str, dtype: str) -> None:
        from tokenizers import Tokenizer

        # encode_batch, not encode_batch_fast: the "fast" one (no offsets) measured 10-20% slower with
        # tokenizers 0.23 on byte-level BPE (bench/prepare_throughput.py's corpus).
        self.path = path
        self.tokenizer = Tokenizer.from_file(path)
        self.literal: Any = None  # the same tokenizer with encode_special_tokens on, loaded when first needed
        added = (
            self.tokenizer.get_added_tokens_decoder()
            if hasattr(self.tokenizer, "get_added_tokens_decoder")
            else {}
        )
        self.special_ids = np.array(sorted(i for i, t in added.items() if t.special), dtype=np.int64)
        self.can_literal = bool(len(self.special_ids)) and hasattr(self.tokenizer, "encode_special_tokens")
        self.dtype = np.dtype(dtype).newbyteorder("<")

    def _ids(self, tokenizer: Any, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = [encoding.ids for encoding in tokenizer.encode_batch(documents, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return np.fromiter(chain.from_iterable(ids), self.dtype, int(lengths.sum())), lengths

    def encode_with_specials(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self._ids(self.tokenizer, texts)

    def encode(self, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        body, lengths = self._ids(self.tokenizer, documents)
        if self.can_literal and np.isin(body, self.special_ids).any():
            if self.literal is None:
                from tokenizers import Tokenizer

                self.literal = Tokenizer.from_file(self.path)
                self.literal.encode_special_tokens = True
            body, lengths = self._ids(self.literal, documents)
        return body, lengths


def encoder_for(choice: TokenizerChoice) -> Encoder:
    if choice.info.name == BYTES and choice.info.path is None:
        return BytesEncoder(choice.dtype)
    assert choice.info.path is not None
    return HFEncoder(choice.info.path, choice.dtype)
