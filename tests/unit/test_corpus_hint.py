"""A corpus given where token ids belong (data.path) is named for what it is, with the way to prepare it."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import numpy as np
import pytest

from contract.data.source_checks import token_file_problem

WORDS = ["quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "runs", "away", "far"]
TEXT = "\n".join(" ".join(WORDS[(i * 7 + j * 5) % len(WORDS)] for j in range(i % 9 + 3)) for i in range(400))


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


CASES = {
    "utf8": (lambda: TEXT.encode(), "looks like UTF-8 text"),
    "utf16-bom": (lambda: TEXT.encode("utf-16"), "looks like UTF-16 text"),
    "utf16-le-no-bom": (lambda: TEXT.encode("utf-16-le"), "looks like UTF-16 text"),
    "utf16-be-no-bom": (lambda: TEXT.encode("utf-16-be"), "looks like UTF-16 text"),
    "gzip": (lambda: gzip.compress(TEXT.encode()), "is a gzip-compressed file"),
    "zstd": (lambda: _zstd(TEXT.encode()), "is a zstd-compressed file"),
    "bzip2": (lambda: bz2.compress(TEXT.encode()), "is a bzip2-compressed file"),
}


# ASCII in UTF-16-LE read as uint16 is a valid byte-level token file, rightly accepted: not a case.
PAIRS = [(k, d) for k in CASES for d in ("uint16", "uint32") if (k, d) != ("utf16-le-no-bom", "uint16")]


@pytest.mark.parametrize(("kind", "dtype"), PAIRS)
def test_a_corpus_given_as_tokens_is_named_with_the_fix(tmp_path: Path, kind: str, dtype: str) -> None:
    make, expected = CASES[kind]
    file = tmp_path / "corpus.bin"
    file.write_bytes(make())
    problem = token_file_problem(str(file), dtype, 16, 256)
    assert problem is not None and problem.startswith(expected), problem
    assert "python -m launcher.prepare" in problem


def test_real_token_ids_that_happen_to_start_like_a_magic_number_are_not_refused(tmp_path: Path) -> None:
    ids = np.arange(4096, dtype=np.uint16) % 50000
    ids[0] = 0x8B1F  # the gzip magic, little-endian
    file = tmp_path / "tokens.bin"
    ids.tofile(file)
    assert token_file_problem(str(file), "uint16", 16, 50304) is None


def test_binary_noise_keeps_the_vocabulary_message(tmp_path: Path) -> None:
    file = tmp_path / "noise.bin"
    file.write_bytes(np.random.default_rng(0).integers(0, 2**16, 4096, dtype=np.uint16).tobytes())
    problem = token_file_problem(str(file), "uint16", 16, 256)
    assert problem is not None and "outside the vocabulary" in problem, problem


def test_a_short_text_file_is_named_text_not_too_short(tmp_path: Path) -> None:
    """A 73-byte text file was told it 'holds 36 tokens ... lower data.seq_len' rather than what it is."""
    file = tmp_path / "notes.txt"
    file.write_bytes(b"a few words of plain text, typed where a token file belongs in a config!!\n")  # even: 74 bytes
    problem = token_file_problem(str(file), "uint16", 512, 50304)
    assert problem is not None and problem.startswith("looks like UTF-8 text, not token ids"), problem
    assert "docs/data.md: Prepare a corpus" in problem
    short = tmp_path / "short.bin"
    np.arange(36, dtype=np.uint16).tofile(short)  # real ids, only too few of them
    assert token_file_problem(str(short), "uint16", 512, 50304) == (
        "holds 36 tokens, fewer than one sample (data.seq_len + 1 = 513): lower data.seq_len or use a longer file")
