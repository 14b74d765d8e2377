"""--train-tokenizer bpe:VOCAB: a byte-level BPE trained with the `tokenizers` library on exactly the documents the
preparation reads (the same walk, --include/--exclude, decoding and skip rules: documents.read_documents), saved
where --tokenizer names as `save_pretrained` writes a tokenizer directory: tokenizer.json, tokenizer_config.json (the
end-of-document token as eos_token) and, with --chat-template FILE, chat_template.jinja. The preparation then
encodes with it. trained_on.json beside them records what it was trained on, so the same command run again (a
resumed preparation) keeps it, and a directory holding anything else is never written over.

Byte-level (GPT-2's byte-to-character alphabet, every byte in the vocabulary), so any text encodes and decodes back
exactly; no transformers import (the login side never imports it): the files are the ones transformers reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contract.errors import ConfigError
from launcher.prepare.inputs import InputFile, ReadOptions, Skipped

RECORD = "trained_on.json"
DEFAULT_EOD = "<|endoftext|>"
MIN_VOCAB = 258  # the 256 bytes, the end-of-document token and at least one merge
# The largest vocabularies models train with are about 256k; the `tokenizers` trainer sizes its tables by the
# vocabulary asked, and bpe:10000000000 ended the process in a Rust out-of-memory abort (exit 134, a backtrace).
MAX_VOCAB = 1 << 22
SPEC = re.compile(r"^bpe:(\d+)$")


@dataclass(frozen=True)
class Training:
    """What a trained tokenizer is: two trainings with equal fields give the same tokenizer."""

    vocab_size: int
    eod_token: str
    chat_template_sha256: str | None
    read: dict[str, Any]  # the ReadOptions the documents were read with
    inputs: list[list[Any]]  # [path, bytes, mtime_ns] of every input file selected


def parse_spec(spec: str) -> int:
    found = SPEC.match(spec.strip())
    if found is None:
        raise ConfigError(f"--train-tokenizer {spec} is not bpe:VOCAB: give the vocabulary size to train, e.g. "
                          "--train-tokenizer bpe:32000")
    vocab = int(found.group(1))
    if vocab < MIN_VOCAB:
        raise ConfigError(f"--train-tokenizer {spec}: give a vocabulary of at least {MIN_VOCAB} (the 256 bytes, the "
                          "end-of-document token and one merge), e.g. bpe:32000")
    if vocab > MAX_VOCAB:
        raise ConfigError(f"--train-tokenizer {spec}: give a vocabulary of at most {MAX_VOCAB:,} (models train with "
                          "up to about 256k), e.g. bpe:32000")
    return vocab


def check_request(spec: str, directory: str, template: str | None, sft: bool) -> tuple[int, Path, str | None]:
    """(vocabulary, tokenizer directory, chat template text): refused in one line before anything is read."""
    vocab = parse_spec(spec)
    if directory == "bytes":
        raise ConfigError("--train-tokenizer writes a tokenizer directory, and --tokenizer bytes names none: give "
                          "--tokenizer DIR, where the trained tokenizer is saved")
    if sft:
        raise ConfigError("--train-tokenizer trains on plain text, and --prompt-field/--messages-field prepare "
                          "fine-tuning records: train the tokenizer on your text corpus first, then prepare the "
                          "records with --tokenizer DIR")
    text = None
    if template is not None:
        path = Path(template).expanduser()
        if not path.is_file():
            raise ConfigError(f"--chat-template {template} does not exist: give a Jinja file (a chat template as "
                              "chat_template.jinja holds one)")
        text = path.read_text(encoding="utf-8")
    return vocab, Path(directory).expanduser().resolve(), text


def training_of(vocab: int, eod_token: str, template: str | None, read: ReadOptions,
                inputs: list[InputFile]) -> Training:
    digest = None if template is None else "sha256:" + hashlib.sha256(template.encode()).hexdigest()
    return Training(vocab, eod_token, digest, asdict(read), [[f.path, f.bytes, f.mtime_ns] for f in inputs])


def already_trained(directory: Path, training: Training) -> bool:
    """True when `directory` holds the tokenizer of this very training; ConfigError when it holds anything else."""
    if not directory.exists():
        return False
    try:
        recorded = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = None
    if recorded == json.loads(json.dumps(asdict(training))) and (directory / "tokenizer.json").is_file():
        return True
    raise ConfigError(f"{directory} exists and holds no tokenizer trained on these documents with these settings: "
                      "give --tokenizer a new directory, remove it, or drop --train-tokenizer to prepare with the "
                      "tokenizer it holds")


def documents(inputs: list[InputFile], read: ReadOptions, counts: list[int]) -> Iterator[str]:
    """The documents the preparation reads, in its order; files it skips are skipped here too. counts: [documents,
    characters] read."""
    from launcher.prepare.documents import read_documents

    for file in inputs:
        try:
            for text in read_documents(file, read):
                counts[0] += 1
                counts[1] += len(text)
                yield text
        except Skipped:
            continue


def train(directory: Path, training: Training, template: str | None, inputs: list[InputFile],
          read: ReadOptions) -> str:
    """Train, save into `directory` (written beside it, then renamed: a failed training leaves nothing) and return
    the line that says what was trained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=training.vocab_size, special_tokens=[training.eod_token],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    counts = [0, 0]
    tokenizer.train_from_iterator(documents(inputs, read, counts), trainer=trainer)
    if not counts[0]:
        raise ConfigError("--train-tokenizer found no documents to train on in the files selected: check the "
                          "inputs and --include/--exclude")
    base = directory.parent
    base.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=base))
    try:
        tokenizer.save(str(temporary / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": training.eod_token,
                  "clean_up_tokenization_spaces": False}
        (temporary / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        if template is not None:
            (temporary / "chat_template.jinja").write_text(template, encoding="utf-8")
        (temporary / RECORD).write_text(json.dumps(asdict(training), indent=1) + "\n")
        os.rename(temporary, directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    short = (f"; bpe:{training.vocab_size} asked for {training.vocab_size:,}, and these documents hold no more pairs "
             "to merge: train on more text, or ask for fewer" if size < training.vocab_size else "")
    return (f"trained tokenizer {directory}: byte-level BPE of {size:,} tokens (end of document "
            f"{training.eod_token!r}{', a chat template' if template is not None else ''}) on {counts[0]:,} "
            f"documents ({counts[1] / 1e6:,.1f} M characters) of the files selected{short}")
