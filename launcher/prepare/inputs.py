"""Input files: finding them (files, directories, globs) and reading their documents.

Formats by extension, after a `.gz`, `.zst`, `.bz2` or `.xz` suffix is taken off (compressed files are read as
they are):
  .jsonl .ndjson .json   JSON Lines: one object per line, the document in the field `--text-field`
  .parquet               Parquet: the document in the column `--text-field` (compressed inside; no .gz/.zst)
  anything else          UTF-8 text: the whole file one document, or one per line with `--text-per-line`
Empty documents (and blank lines in the line formats) are skipped: they would be only an end-of-document id.

A corpus is taken as it comes, the way tools that read trees do (git, ripgrep): a file found in a directory or by
a glob that is binary (a NUL byte in its first block, once decompressed, or compressed without the suffix that
says so) is skipped, and so, by default, is one that is not UTF-8 text; a file named one by one is refused
instead. `--encoding-errors strict|skip|replace` sets the second for every file. So is a file found whose first
record can't be read in its extension's format (a `.json` or `.json.gz` that is a JSON document, not JSON Lines; a
`.parquet` that is not Parquet), and one whose compressed stream can't be read to its end (a `.gz` that is plain
text, a truncated download): `--strict` stops instead, naming every --exclude the tree needs. A file whose later
line is damaged stops the run with its line number, as a file named one by one does at any line. A skipped file
raises Skipped before its first document, so that a file is read whole or not at all.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from contract.errors import ConfigError
from launcher.prepare.filters import Filters

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".bz2": "bz2", ".xz": "xz"}
# How each compression's stream starts (bzip2: "BZh", a block size, then the block magic, pi's digits in BCD).
MAGIC = {
    "gz": re.compile(rb"\x1f\x8b"),
    "zst": re.compile(rb"\x28\xb5\x2f\xfd"),
    "bz2": re.compile(rb"BZh[1-9]1AY&SY"),
    "xz": re.compile(rb"\xfd7zXZ\x00"),
}
SNIFF_BYTES = 8000  # the first block git and ripgrep look at for a NUL byte
_GLOB_CHARS = set("*?[")
SKIPPED_DIRS = {"__pycache__"}  # Python's byte code beside the sources of a code corpus
ENCODING_ERRORS = ("strict", "skip", "replace")
# why a file was skipped
BINARY, NOT_UTF8, NOT_JSONL, NOT_PARQUET, DAMAGED = "binary", "not_utf8", "not_jsonl", "not_parquet", "damaged"
REASONS = {BINARY: "binary", NOT_UTF8: "not UTF-8", NOT_JSONL: "not JSON Lines", NOT_PARQUET: "not Parquet",
           DAMAGED: "unreadable compressed data"}


class BadInput(ConfigError):
    """An input file that cannot be read as its format says: names the file (and line) and the fix."""


class NotItsFormat(BadInput):
    """A file's first record that can't be read in its extension's format: a file found is skipped for it (unless
    --strict), one named is refused."""


class Skipped(Exception):
    """A file that is not read (raised before its first document): `reason` is one of REASONS' keys."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    kind: str  # "text" | "jsonl" | "parquet"
    compression: str | None  # None | "gz" | "zst" | "bz2" | "xz"
    bytes: int
    mtime_ns: int
    named: bool = True  # named one by one (False: found in a directory or by a glob)


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    text_per_line: bool = False
    encoding_errors: str | None = None  # None: strict for a file named one by one, skip for one found
    strict: bool = False  # --strict: a file found that is not in its extension's format stops the run

    def errors_for(self, file: InputFile) -> str:
        return self.encoding_errors or ("strict" if file.named else "skip")

    def skips_misfit(self, file: InputFile) -> bool:
        """Whether a file whose first record is not in its extension's format is skipped (else refused)."""
        return not file.named and not self.strict


def format_of(path: str) -> tuple[str, str | None]:
    """(kind, compression) from the file name."""
    name = path.lower()
    compression = None
    for suffix, comp in COMPRESSIONS.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], comp
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl", compression
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet", compression
    return "text", compression


def resolve_inputs(
    specs: list[str], out: Path | None = None, filters: Filters | None = None
) -> list[InputFile]:
    """Every input file named by `specs` (files, directories searched recursively, globs), sorted by path and
    without repeats. The files found in a directory or by a glob are those `filters` choose (on the path under that
    directory, or under the glob's leading directory); hidden files and directories (a name starting with '.') and
    __pycache__ inside a directory are left out, and so is everything under `out` (the output directory, when it
    lies inside an input directory). A binary file named one by one is refused."""
    filters = filters or Filters()
    found: dict[Path, bool] = {}  # path -> named one by one (a file both named and found counts as named)
    searched = False
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            searched = True
            found.update((p, found.get(p, False)) for p in _walk(path, path, filters))
        elif path.is_file():
            found[path] = True
        elif _GLOB_CHARS & set(spec):
            searched = True
            matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
            if not matches:
                raise ConfigError(
                    f"no file matches {spec!r}: check the pattern (quote it so that the shell "
                    f"does not expand it first)"
                )
            base = _glob_base(spec)
            for match in map(Path, matches):
                chosen = _walk(match, base, filters) if match.is_dir() else _chosen(match, base, filters)
                found.update((p, found.get(p, False)) for p in chosen)
        elif path.exists():
            raise ConfigError(
                f"input {spec} is not a regular file or directory: give text, JSON Lines or "
                f"Parquet files, or directories holding them"
            )
        else:
            raise ConfigError(
                f"input {spec} does not exist: check the path (files, directories and globs are accepted)"
            )
    if filters and not searched:
        raise ConfigError(
            f"{filters.describe()} choose among the files found in directories or by globs, and every input "
            f"here is a file named one by one: give a directory (or a glob), or leave the filters out"
        )
    resolved: dict[Path, bool] = {}
    for path, named in found.items():
        real = path.resolve()
        resolved[real] = resolved.get(real, False) or named
    if out is not None:
        out = out.resolve()
        resolved = {p: n for p, n in resolved.items() if out != p and out not in p.parents}
    if not resolved:
        chosen_by = f" chosen by {filters.describe()}" if filters else ""
        raise ConfigError(
            f"no input files{chosen_by} in {' '.join(specs)}: give text, JSON Lines or Parquet files, "
            f"or directories holding them"
            + (" (the globs match the path under each directory, e.g. '*.py' or 'src/**')" if filters else "")
        )
    return [_describe(p, resolved[p]) for p in sorted(resolved, key=str)]


def _glob_base(spec: str) -> Path:
    """The directory a glob starts from: its leading parts without a wildcard."""
    fixed = []
    for part in Path(os.path.expanduser(spec)).parts:
        if _GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path()


def _chosen(path: Path, base: Path, filters: Filters) -> list[Path]:
    if not path.is_file():
        return []
    return [path] if not filters or filters.chooses(path.relative_to(base).as_posix()) else []


def _walk(root: Path, base: Path, filters: Filters) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in filenames:
            if not name.startswith("."):
                yield from _chosen(Path(dirpath) / name, base, filters)


def _describe(path: Path, named: bool) -> InputFile:
    kind, compression = format_of(str(path))
    if kind == "parquet" and compression:
        raise ConfigError(
            f"{path}: a compressed Parquet file is not read; Parquet compresses inside: "
            f"decompress it (it stays as small)"
        )
    try:
        st = path.stat()
        with open(path, "rb"):
            pass
    except OSError as err:
        raise ConfigError(
            f"cannot read {path} ({err.strerror}): fix its permissions or leave it out"
        ) from None
    file = InputFile(str(path), kind, compression, st.st_size, st.st_mtime_ns, named)
    if named:  # refused before anything is written (a file found is skipped when its task reads it)
        why = binary_why(file)
        if why is not None:
            raise _binary(file, why)
    return file


def binary_why(file: InputFile) -> str | None:
    """Why the file is binary, in words, or None for text: the way git and ripgrep tell (a NUL byte in the first
    block, here once decompressed), and compressed data that its name does not say is compressed."""
    if file.kind == "parquet":
        return None  # binary by design, read by its own reader
    try:
        with _open(file) as raw:
            head = raw.read(SNIFF_BYTES)
    except _read_errors() as err:
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or {_leave_out(file)}") from None
    inside = f"{file.compression}-compressed " if file.compression else ""
    for compression, magic in MAGIC.items():
        if magic.match(head):
            return f"{inside}{compression}-compressed data without .{compression} in its name"
    if b"\0" in head:
        return f"a NUL byte in its first {SNIFF_BYTES:,} bytes" + (" once decompressed" if inside else "")
    return None


def _binary(file: InputFile, why: str) -> BadInput:
    fix = "add that suffix to its name if it holds text" if "in its name" in why else "leave it out"
    return BadInput(
        f"{file.path} is binary ({why}): {fix} (binary files found in a directory are skipped)"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _open(file: InputFile) -> IO[bytes]:
    if file.compression == "gz":
        return cast(IO[bytes], gzip.open(file.path, "rb"))
    if file.compression == "zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(file.path, "rb"), closefd=True)
    if file.compression == "bz2":
        import bz2

        return cast(IO[bytes], bz2.open(file.path, "rb"))
    if file.compression == "xz":
        import lzma

        return cast(IO[bytes], lzma.open(file.path, "rb"))
    return open(file.path, "rb", buffering=1 << 20)


def _read_errors() -> tuple[type[BaseException], ...]:
    import lzma

    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - a dependency
        pass
    return tuple(errors)


def _leave_out(file: InputFile, every: bool = False) -> str:
    """How to leave the file out: for one found in a directory or by a glob, the --exclude that does it (`every`:
    for every file of its format, as for the .json files of a code tree, which are seldom JSON Lines)."""
    if file.named:
        return "leave it out"
    if not every:
        return f"leave it out with --exclude {exclude_literal(file)}"
    return f"leave such files out with --exclude {format_pattern(file)}"


def exclude_literal(file: InputFile) -> str:
    """The --exclude (shell-quoted) that leaves out this file alone: its name as a .gitignore line."""
    name = Path(file.path).name
    return shlex.quote(re.sub(r"^([!#])", r"\\\1", re.sub(r"([\[\]*?\\])", r"\\\1", name)))


def format_pattern(file: InputFile) -> str:
    """The --exclude (shell-quoted) that leaves out every file of this one's format: '*.json.gz'."""
    name = Path(file.path).name
    lower, suffix = name.lower(), ""
    for ending in (*COMPRESSIONS, *JSONL_SUFFIXES, *PARQUET_SUFFIXES):
        if lower[: len(lower) - len(suffix)].endswith(ending):
            suffix = name[len(name) - len(suffix) - len(ending) :]
    return shlex.quote("*" + suffix)








