"""Whether a token source can be trained on by a model, checked without torch where it is configured: at launch
(data.path, data.sources: launcher/checks/input_checks.py) and for evaluation sets, at launch and on the ranks
(contract/rules/eval_sets.py). A corpus that reached data.path untokenized is named for what it is, with the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from contract.errors import ConfigError

SCAN_BYTES = 256 * 2**20
SAMPLE_WINDOWS = 256
WINDOW_BYTES = 2**20
# A glob of token files: every file's size is checked, the ids of this many of them (evenly spread) are read.
GLOB_FILES_SCANNED = 8
TEXT_PROBE_BYTES = 64 * 1024
PREPARE = "python -m launcher.prepare FILE --out DIR --tokenizer bytes, then data.path=DIR; docs/data.md: Prepare a corpus"
TEXT_HINT = f"looks like UTF-8 text, not token ids: tokenize it into token shards first ({PREPARE})"
# A file's first bytes -> what it is: corpora that reach data.path untokenized, by their magic numbers.
MAGIC = {
    b"\x1f\x8b": ("a gzip-compressed file", True),
    b"\x28\xb5\x2f\xfd": ("a zstd-compressed file", True),
    b"PAR1": ("a Parquet file", True),
    b"BZh": ("a bzip2-compressed file", False),
    b"\xfd7zXZ\x00": ("an xz-compressed file", False),
    b"PK\x03\x04": ("a zip archive", False),
}


def corpus_hint(file: Path) -> str | None:
    """What the file is when it is a corpus rather than token ids (the message's middle, naming the fix), or None:
    UTF-8 or UTF-16 text, or a compressed or columnar file, by its head."""
    with file.open("rb") as f:
        head = f.read(TEXT_PROBE_BYTES)
    for magic, (what, prepared) in MAGIC.items():
        if head.startswith(magic):
            fix = (f"prepare it into token shards first ({PREPARE} reads it as it is)" if prepared
                   else "decompress it and prepare the text into token shards first ("
                   f"{PREPARE})")
            return f"is {what}, not token ids: {fix}"
    if _utf16(head):
        return ("looks like UTF-16 text, not token ids: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8 FILE > "
                f"FILE.txt) and tokenize that into token shards ({PREPARE})")
    return TEXT_HINT if _utf8_text(head) else None


def _utf16(head: bytes) -> bool:
    """A byte-order mark, or mostly ASCII text with a zero byte beside every character."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    if len(head) < 16:
        return False
    for zeros, chars in ((head[1::2], head[0::2]), (head[0::2], head[1::2])):
        if zeros.count(0) >= 0.95 * len(zeros) and _utf8_text(chars.replace(b"\x00", b"")):
            return True
    return False


def _utf8_text(head: bytes) -> bool:
    """The bytes decode as UTF-8 and are mostly printable characters and whitespace."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not just a character cut at the end of the probe
            return False
        text = head[: err.start].decode("utf-8")
    if not text:
        return False
    printable = sum(1 for c in text if c.isprintable() or c in "\n\r\t")
    return printable / len(text) >= 0.95


def token_file_problem(path: str, dtype: str, seq_len: int, vocab_size: int, scan: bool = True) -> str | None:
    """Why the token file can't be trained on (the message's middle), or None; `scan`: also read its ids."""
    import numpy as np

    file = Path(path).expanduser()
    if not file.exists():
        return "does not exist"
    if not file.is_file():
        return "is not a regular file"
    if not os.access(file, os.R_OK):
        return "is not readable for you"
    size = file.stat().st_size
    itemsize = np.dtype(dtype).itemsize
    if size == 0:
        return "is empty"
    if size % itemsize:
        hint = corpus_hint(file)
        if hint:
            return hint
        return (f"is {size} bytes, not a whole number of data.dtype={dtype} tokens ({itemsize} bytes each): is "
                "data.dtype right?")
    if size // itemsize < seq_len + 1:
        hint = corpus_hint(file)  # a short text file is text before it is too short
        if hint:
            return hint
        return (f"holds {size // itemsize} tokens, fewer than one sample (data.seq_len + 1 = {seq_len + 1}): lower "
                "data.seq_len or use a longer file")
    if not scan:
        return None
    tokens = np.memmap(file, dtype=np.dtype(dtype), mode="r")
    windows: list[Any]
    if size <= SCAN_BYTES:
        windows = [tokens]
    else:
        per = WINDOW_BYTES // itemsize
        starts = np.linspace(0, len(tokens) - per, SAMPLE_WINDOWS).astype(np.int64)
        windows = [tokens[s : s + per] for s in starts]
    low = min(int(w.min()) for w in windows)
    high = max(int(w.max()) for w in windows)
    if low < 0 or high >= vocab_size:
        hint = corpus_hint(file)
        if hint:
            return hint
        bad = high if high >= vocab_size else low
        return (f"holds token id {bad}, outside the vocabulary of model.vocab_size={vocab_size}: is data.dtype "
                f"right, or does the model need model.vocab_size>{high}?")
    return None


def source_problem(spec: Any, seq_len: int, vocab_size: int) -> str | None:
    """Why one resolved source (contract/data/spec.py SourceSpec) can't be trained on (the message's middle), or None:
    a prepared dataset by its manifest, token files by what they hold (a glob: every size, a sample of files)."""
    if spec.manifest is not None:
        tokenizer = spec.manifest.tokenizer
        if tokenizer.vocab_size > vocab_size:
            return (f"was prepared with a vocabulary of {tokenizer.vocab_size} ids (tokenizer {tokenizer.name}) but "
                    f"model.vocab_size={vocab_size}: set model.vocab_size={tokenizer.vocab_size} (or more)")
        if spec.windows(seq_len) < 1:
            return (f"holds {spec.tokens} train tokens, fewer than one sample (data.seq_len + 1 = {seq_len + 1}): "
                    "lower data.seq_len or prepare more text")
        return None
    if spec.kind == "file":
        return token_file_problem(spec.path, spec.dtype, seq_len, vocab_size)
    step = max(1, len(spec.files) // GLOB_FILES_SCANNED)
    scanned = set(spec.files[::step]) | {spec.files[-1]}
    for file in spec.files:
        problem = token_file_problem(str(file), spec.dtype, 0, vocab_size, scan=file in scanned)
        if problem:
            return f"holds {file}, which {problem}"
    if spec.windows(seq_len) < 1:
        return (f"holds {spec.tokens} tokens in all, fewer than one sample (data.seq_len + 1 = {seq_len + 1}): "
                "lower data.seq_len or add files")
    return None


def check_source(spec: Any, seq_len: int, vocab_size: int) -> None:
    """ConfigError (one line naming spec.key) when a resolved source can't be read by this model."""
    problem = source_problem(spec, seq_len, vocab_size)
    if problem:
        raise ConfigError(f"{spec.key}={spec.path} {problem}" + ("" if ":" in problem else
                                                                  f": point {spec.key} at a file of token ids"))
