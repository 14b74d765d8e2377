"""Reading an input file's documents: text (a document per file or per line), JSON Lines (one field) or
Parquet (one column), compressed or not; text that is not UTF-8 as --encoding-errors says.
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterator
from typing import IO, Any

from launcher.prepare.inputs import (
    BINARY,
    DAMAGED,
    NOT_JSONL,
    NOT_PARQUET,
    NOT_UTF8,
    BadInput,
    InputFile,
    NotItsFormat,
    ReadOptions,
    Skipped,
    _binary,
    _first_line,
    _leave_out,
    _open,
    _read_errors,
    binary_why,
    exclude_literal,
    format_pattern,
)


def check_columns(files: list[InputFile], options: ReadOptions) -> None:
    """Refuse, before anything is written, a Parquet file without the text column (its schema is cheap to read)."""
    for file in files:
        if file.kind == "parquet":
            try:
                names = _parquet_file(file).schema_arrow.names
            except NotItsFormat:
                if options.skips_misfit(file):
                    continue  # skipped when its task reads it
                raise
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
        raise NotItsFormat(
            f"cannot read {file.path} as Parquet ({_first_line(err)}): replace it or {_leave_out(file)}"
        ) from None


def check_formats(files: list[InputFile], options: ReadOptions) -> None:
    """--strict: refuse, before anything is written, the files found whose first record is not in their
    extension's format or whose compressed stream can't be read to its end, naming every --exclude they need (one
    run, not one try per pattern)."""
    if not options.strict:
        return
    misfits: list[tuple[InputFile, str]] = []
    damaged: list[tuple[InputFile, str]] = []
    for file in files:
        if file.named:
            continue
        if file.compression and file.kind != "parquet":
            try:
                binary_why(file)
                _whole_stream_is_utf8(file)
            except _unreadable() as err:
                damaged.append((file, str(err) if isinstance(err, BadInput) else _first_line(err)))
                continue
        if file.kind != "jsonl":
            continue
        try:
            next(iter(read_documents(file, options)), None)
        except NotItsFormat as err:
            misfits.append((file, str(err)))
        except (BadInput, Skipped):
            pass  # refused or skipped when its task reads it, as without --strict
    if not misfits and not damaged:
        return
    patterns = list(dict.fromkeys([*(format_pattern(file) for file, _ in misfits),
                                   *(exclude_literal(file) for file, _ in damaged)]))
    first = (misfits or damaged)[0][1].split(": fix the line")[0].split(": name the text")[0].split(": replace it")[0]
    what = []
    if misfits:
        what.append(f"{len(misfits)} files found are not JSON Lines" if len(misfits) > 1
                    else "1 file found is not JSON Lines")
    if damaged:
        what.append(f"{len(damaged)} compressed files found can't be read" if len(damaged) > 1
                    else "1 compressed file found can't be read")
    raise BadInput(f"{first}; {' and '.join(what)}: leave them out with "
                   f"{' '.join(f'--exclude {p}' for p in patterns)}, or drop --strict to skip such files")


def read_documents(file: InputFile, options: ReadOptions) -> Iterator[str]:
    """The file's documents in order. Raises BadInput naming the file (and line) and the fix, or Skipped (before
    the first document) for a file found that is binary, not UTF-8 when its encoding errors are skipped, not in its
    extension's format, or compressed and unreadable to its end (both without --strict)."""
    if file.kind == "parquet":
        try:
            parquet = _parquet_file(file)
        except NotItsFormat:
            if options.skips_misfit(file):
                raise Skipped(NOT_PARQUET) from None
            raise
        yield from _parquet_documents(file, options, parquet)
        return
    errors = options.errors_for(file)
    try:
        try:
            why = binary_why(file)
            line_by_line = file.kind == "jsonl" or options.text_per_line
            check_utf8 = errors == "skip" and line_by_line
            # checked whole first, so that a file is read whole or not at all: its UTF-8 when its encoding errors
            # are skipped, and a found file's compressed stream to its end (a truncated .gz fails only there)
            if why is None and (check_utf8 or (file.compression and options.skips_misfit(file))):
                if not _whole_stream_is_utf8(file) and check_utf8:
                    raise Skipped(NOT_UTF8)
        except _unreadable():
            if options.skips_misfit(file):
                raise Skipped(DAMAGED) from None
            raise
        if why is not None:
            if file.named:
                raise _binary(file, why)
            raise Skipped(BINARY)
        decode = "replace" if errors == "replace" else "strict"
        with _open(file) as raw:
            if file.kind == "jsonl":
                try:
                    yield from _jsonl_documents(raw, file, options.text_field, decode)
                except NotItsFormat:  # raised at the first record, before any document
                    if options.skips_misfit(file):
                        raise Skipped(NOT_JSONL) from None
                    raise
            elif options.text_per_line:
                yield from _line_documents(raw, file, decode)
            else:
                data = raw.read()
                try:
                    text = data.decode("utf-8", decode)
                except UnicodeDecodeError as err:
                    if errors == "skip":
                        raise Skipped(NOT_UTF8) from None
                    raise _not_utf8(file, f"byte {err.start}") from None
                if text:
                    yield text
    except _read_errors() as err:
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or {_leave_out(file)}") from None


def _unreadable() -> tuple[type[BaseException], ...]:
    """What reading a file's stream raises when it can't be read (binary_why says BadInput for it)."""
    return (BadInput, *_read_errors())


def _whole_stream_is_utf8(file: InputFile) -> bool:
    """Whether the file, read (decompressed) to its end, is UTF-8; a stream that can't be read raises one of
    _read_errors()."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    utf8 = True
    with _open(file) as raw:
        while chunk := raw.read(1 << 20):
            if utf8:
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError:
                    utf8 = False
    if utf8:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    return utf8


def _not_utf8(file: InputFile, where: str) -> BadInput:
    return BadInput(
        f"{file.path} is not UTF-8 text at {where}: convert it (e.g. `iconv -f latin1 -t utf-8`), "
        f"{_leave_out(file)}, or add --encoding-errors skip (or replace)"
    )


def _lines(raw: IO[bytes]) -> IO[bytes]:
    """A buffered reader to iterate by line (zstandard's stream reader has no readline of its own)."""
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw, 1 << 20)  # type: ignore[type-var]


def _line_documents(raw: IO[bytes], file: InputFile, decode: str) -> Iterator[str]:
    for lineno, line in enumerate(_lines(raw), 1):
        try:
            text = line.decode("utf-8", decode).rstrip("\r\n")
        except UnicodeDecodeError:
            raise _not_utf8(file, f"line {lineno}") from None
        if text:
            yield text


def _jsonl_documents(raw: IO[bytes], file: InputFile, field: str, decode: str) -> Iterator[str]:
    """The documents of a JSON Lines file; BadInput naming the line and the fix, NotItsFormat when that line is the
    first record (the file is some other JSON, not JSON Lines of this field)."""
    first = True
    for lineno, line in enumerate(_lines(raw), 1):
        if not line.strip():
            continue
        try:
            text = _jsonl_text(line, lineno, file, field, decode, first)
        except BadInput as err:
            if first and not isinstance(err, NotItsFormat) and not str(err).startswith(f"{file.path} is not UTF-8"):
                raise NotItsFormat(str(err)) from None
            raise
        first = False
        if text:
            yield text


def _jsonl_text(line: bytes, lineno: int, file: InputFile, field: str, decode: str, first: bool) -> str:
    """`first`: the file's first record, where a misfit means a file of another format (the fix: leave every file of
    that format out); a bad line further in is this file's alone (leave it out by name, not the good ones too)."""
    try:
        record = json.loads(line if decode == "strict" else line.decode("utf-8", decode))
    except UnicodeDecodeError:
        raise _not_utf8(file, f"line {lineno}") from None
    except ValueError as err:  # JSONDecodeError
        raise BadInput(
            f"{file.path} line {lineno} is not JSON ({_first_line(err)}): fix the line, or "
            f"{_leave_out(file, every=first)}"
        ) from None
    try:
        text = record[field]
    except (KeyError, TypeError):
        keys = ", ".join(map(repr, record)) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        raise BadInput(
            f"{file.path} line {lineno} has no field {field!r} (it has {keys}): name the text "
            f"field with --text-field, or {_leave_out(file, every=first)}"
        ) from None
    if not isinstance(text, str):
        raise BadInput(
            f"{file.path} line {lineno}: field {field!r} is {type(text).__name__}, not text: "
            f"name the text field with --text-field, or {_leave_out(file, every=first)}"
        ) from None
    return text


def _parquet_documents(file: InputFile, options: ReadOptions, parquet: Any) -> Iterator[str]:
    import pyarrow

    field = options.text_field
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
        raise BadInput(f"cannot read {file.path} ({_first_line(err)}): replace it or {_leave_out(file)}") from None
