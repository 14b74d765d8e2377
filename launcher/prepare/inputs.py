"""Input files: finding them (files, directories, globs) and reading their documents.

Formats by extension, after a `.gz` or `.zst` suffix is taken off (compressed files are read as they are):
  .jsonl .ndjson .json   JSON Lines: one object per line, the document in the field `--text-field`
  .parquet               Parquet: the document in the column `--text-field` (compressed inside; no .gz/.zst)
  anything else          UTF-8 text: the whole file one document, or one per line with `--text-per-line`
Empty documents (and blank lines in the line formats) are skipped: they would be only an end-of-document id.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from launcher.errors import ConfigError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSIONS = {".gz": "gz", ".zst": "zst"}
_GLOB_CHARS = set("*?[")
SKIPPED_DIRS = {"__pycache__"}  # Python's byte code beside the sources of a code corpus


class BadInput(ConfigError):
    """An input file that cannot be read as its format says: names the file (and line) and the fix."""


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    kind: str  # "text" | "jsonl" | "parquet"
    compression: str | None  # None | "gz" | "zst"
    bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    text_per_line: bool = False


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


def resolve_inputs(specs: list[str], exclude: Path | None = None) -> list[InputFile]:
    """Every input file named by `specs` (files, directories searched recursively, globs), sorted by path and
    without repeats. Hidden files and directories (a name starting with '.') and __pycache__ inside a directory are
    skipped, and so is everything under `exclude` (the output directory, when it lies inside an input directory)."""
    found: set[Path] = set()
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            found.update(_walk(path))
        elif path.is_file():
            found.add(path)
        elif _GLOB_CHARS & set(spec):
            matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
            if not matches:
                raise ConfigError(
                    f"no file matches {spec!r}: check the pattern (quote it so that the shell "
                    f"does not expand it first)"
                )
            for match in map(Path, matches):
                found.update(_walk(match) if match.is_dir() else [match] if match.is_file() else [])
        elif path.exists():
            raise ConfigError(
                f"input {spec} is not a regular file or directory: give text, JSON Lines or "
                f"Parquet files, or directories holding them"
            )
        else:
            raise ConfigError(
                f"input {spec} does not exist: check the path (files, directories and globs are accepted)"
            )
    resolved = {p.resolve() for p in found}
    if exclude is not None:
        out = exclude.resolve()
        resolved = {p for p in resolved if out != p and out not in p.parents}
    if not resolved:
        raise ConfigError(
            f"no input files in {' '.join(specs)}: give text, JSON Lines or Parquet files, "
            f"or directories holding them"
        )
    return [_describe(p) for p in sorted(resolved, key=str)]


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in filenames:
            if not name.startswith("."):
                path = Path(dirpath) / name
                if path.is_file():
                    yield path


def _describe(path: Path) -> InputFile:
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
    return InputFile(str(path), kind, compression, st.st_size, st.st_mtime_ns)


def check_columns(files: list[InputFile], options: ReadOptions) -> None:
    """Refuse, before anything is written, a Parquet file without the text column (its schema is cheap to read)."""
    for file in files:
        if file.kind == "parquet":
            names = _parquet_file(file).schema_arrow.names
            if options.text_field not in names:
                raise BadInput(
                    f"{file.path} has no column {options.text_field!r} (it has {', '.join(names)}): "
                    f"name the text column with --text-field"
                )


def _parquet_file(file: InputFile):  # -> pyarrow.parquet.ParquetFile
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file.path)
    except (OSError, pyarrow.ArrowException) as err:
        raise BadInput(
            f"cannot read {file.path} as Parquet ({_first_line(err)}): replace it or leave it out"
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _open(file: InputFile) -> IO[bytes]:
    if file.compression == "gz":
        return cast(IO[bytes], gzip.open(file.path, "rb"))
    if file.compression == "zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(file.path, "rb"), closefd=True)
    return open(file.path, "rb", buffering=1 << 20)


def _read_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - a dependency
        pass
    return tuple(errors)


def read_documents(file: InputFile, options: ReadOptions) -> Iterator[str]:
    """The file's documents in order. Raises BadInput naming the file (and line) and the fix."""
    if file.kind == "parquet":
        yield from _parquet_documents(file, options)
        return
    try:
        with _open(file) as raw:
            if file.kind == "jsonl":
                yield from _jsonl_documents(raw, file, options.text_field)
            elif options.text_per_line:
                yield from _line_documents(raw, file)
            else:
                data = raw.read()
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise _not_utf8(file, f"byte {err.start}") from None
                if text:
                    yield text
    except _read_errors() as err:
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or leave it out") from None


def _not_utf8(file: InputFile, where: str) -> BadInput:
    return BadInput(
        f"{file.path} is not UTF-8 text at {where}: convert it (e.g. `iconv -f latin1 -t utf-8`) "
        f"or leave it out"
    )


def _lines(raw: IO[bytes]) -> IO[bytes]:
    """A buffered reader to iterate by line (zstandard's stream reader has no readline of its own)."""
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw, 1 << 20)  # type: ignore[type-var]


def _line_documents(raw: IO[bytes], file: InputFile) -> Iterator[str]:
    for lineno, line in enumerate(_lines(raw), 1):
        try:
            text = line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise _not_utf8(file, f"line {lineno}") from None
        if text:
            yield text


def _jsonl_documents(raw: IO[bytes], file: InputFile, field: str) -> Iterator[str]:
    loads = json.loads
    for lineno, line in enumerate(_lines(raw), 1):
        if not line.strip():
            continue
        try:
            record = loads(line)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            raise BadInput(
                f"{file.path} line {lineno} is not JSON ({_first_line(err)}): fix the line or "
                f"leave the file out"
            ) from None
        try:
            text = record[field]
        except (KeyError, TypeError):
            keys = (
                ", ".join(map(repr, record))
                if isinstance(record, dict)
                else f"a JSON {type(record).__name__}"
            )
            raise BadInput(
                f"{file.path} line {lineno} has no field {field!r} (it has {keys}): name the text "
                f"field with --text-field"
            ) from None
        if not isinstance(text, str):
            raise BadInput(
                f"{file.path} line {lineno}: field {field!r} is {type(text).__name__}, not text: "
                f"name the text field with --text-field"
            ) from None
        if text:
            yield text


def _parquet_documents(file: InputFile, options: ReadOptions) -> Iterator[str]:
    import pyarrow

    field = options.text_field
    parquet = _parquet_file(file)
    if field not in parquet.schema_arrow.names:
        raise BadInput(
            f"{file.path} has no column {field!r} (it has {', '.join(parquet.schema_arrow.names)}): "
            f"name the text column with --text-field"
        )
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=4096, columns=[field]):
            column = batch.column(0)
            if not (pyarrow.types.is_string(column.type) or pyarrow.types.is_large_string(column.type)):
                raise BadInput(
                    f"{file.path}: column {field!r} holds {column.type}, not text: name the text "
                    f"column with --text-field"
                )
            for offset, text in enumerate(column.to_pylist()):
                if text is None:
                    raise BadInput(
                        f"{file.path} row {row + offset} has no {field!r} (null): fill or drop the "
                        f"row, or name another column with --text-field"
                    )
                if text:
                    yield text
            row += len(column)
    except (OSError, pyarrow.ArrowException) as err:
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or leave it out") from None
