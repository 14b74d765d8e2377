"""One task: read its files' documents, split them into train and validation, tokenize them in batches, write the
task's shards, then its completion record.

A shard is written under a temporary name (NNNNN.bin.tmp-PID), flushed to disk and renamed only when whole; the
record (.parts/NNNNN.json) is written the same way, last, so a task counts as complete only when its record
exists and every shard it lists has the size it says. A task that died leaves at most temporary files, which the
next attempt of the same task removes.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import IO, Any

import numpy as np

from contract.data.manifest import SPLITS, Shard, write_json_atomic
from contract.data.sft import RESPONSE, mask_path
from launcher.prepare.documents import read_documents
from launcher.prepare.inputs import InputFile, Skipped
from launcher.prepare.plan import Plan
from launcher.prepare.tokenizer import Encoder, encoder_for

BATCH_CHARS = 1 << 22  # text per encode_batch call: large enough for the tokenizer's threads to share it
BATCH_DOCS = 16384
# Fault injection for the resume tests: the process kills itself (SIGKILL) in the middle of this task's shard.
KILL_AT_TASK_ENV = "SLURMTRAIN_PREPARE_KILL_AT_TASK"

Progress = Callable[[int, int], None]  # (input bytes read, tokens written) since the last call


def shard_name(split: str, index: int) -> str:
    return f"{split}/{index:05d}.bin"


def record_path(plan: Plan, index: int) -> Path:
    return plan.parts / f"{index:05d}.json"


def is_val(text: str, threshold: int, key: bytes) -> bool:
    """The document goes to validation: a keyed hash of its text, so the split of a document never depends on
    which other documents or files are prepared with it."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little") < threshold


def split_key(seed: int) -> bytes:
    return seed.to_bytes(8, "little", signed=True)


def val_threshold(val_fraction: float) -> int:
    return min(int(val_fraction * 2**64), 2**64)


def split_batch(
    body: np.ndarray, lengths: np.ndarray, val: np.ndarray | None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A batch's ids and document lengths cut into train and validation by the documents' `val` flags."""
    if val is None or not val.any():
        return {"train": (body, lengths)}
    per_token = np.repeat(val, lengths)
    return {"train": (body[~per_token], lengths[~val]), "val": (body[per_token], lengths[val])}


def with_eods(body: np.ndarray, lengths: np.ndarray, eod_id: int) -> np.ndarray:
    """The documents' ids (concatenated in `body`, `lengths` each) with the end-of-document id after each."""
    ends = np.cumsum(lengths + 1) - 1
    out = np.empty(len(body) + len(lengths), dtype=body.dtype)
    is_body = np.ones(len(out), dtype=bool)
    is_body[ends] = False
    out[is_body] = body
    out[ends] = eod_id
    return out


class ShardWriter:
    """Appends token arrays to a temporary file, hashing as it goes; commit() renames it into place."""

    def __init__(self, root: Path, rel: str) -> None:
        self.root, self.rel = root, rel
        self.final = root / rel
        self.tmp = self.final.with_name(f"{self.final.name}.tmp-{os.getpid()}")
        self.sha = hashlib.sha256()
        self.tokens = self.documents = self.responses = 0
        self.file: IO[bytes] | None = None

    def write(self, ids: np.ndarray, documents: int) -> None:
        if self.file is None:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.tmp, "wb")
        data = np.ascontiguousarray(ids).data.cast("B")
        if ids.dtype == np.uint8:  # a loss mask: count its response tokens
            self.responses += int(np.count_nonzero(ids & RESPONSE))
        self.file.write(data)
        self.sha.update(data)
        self.tokens += len(ids)
        self.documents += documents

    def commit(self) -> Shard | None:
        if self.file is None:
            return None
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.final)
        return Shard(self.rel, self.tokens, self.documents, self.sha.hexdigest())

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


def remove_stale(plan: Plan, index: int) -> None:
    """Temporary files an earlier attempt of this task left when it was killed."""
    root = Path(plan.out)
    for split in SPLITS:
        final = root / shard_name(split, index)
        for tmp in final.parent.glob(f"{final.name}.tmp-*"):
            tmp.unlink(missing_ok=True)
    for tmp in plan.parts.glob(f"{index:05d}.json.tmp-*"):
        tmp.unlink(missing_ok=True)


def _batches(
    files: list[InputFile], plan: Plan, counts: list[int], skipped: dict[int, str]
) -> Iterator[tuple[list[str], int]]:
    """(documents, input bytes finished) in batches of about BATCH_CHARS characters; counts[i] is the number of
    documents read from files[i], skipped[i] why files[i] was not read (a file is skipped before its first
    document)."""
    batch: list[str] = []
    chars = done_bytes = 0
    for i, file in enumerate(files):
        try:
            for text in read_documents(file, plan.options.read):
                batch.append(text)
                counts[i] += 1
                chars += len(text)
                if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCS:
                    yield batch, done_bytes
                    batch, chars, done_bytes = [], 0, 0
        except Skipped as skip:
            skipped[i] = skip.reason
        done_bytes += file.bytes
    yield batch, done_bytes


Pieces = Iterator[tuple[dict[str, tuple[np.ndarray, np.ndarray | None, int]], int]]


def _plain_pieces(files: list[InputFile], plan: Plan, counts: list[int], skipped: dict[int, str], encoder: Encoder,
                  threshold: int, key: bytes) -> Pieces:
    """Per batch of documents: each split's (ids with end-of-document ids, no mask, documents), input bytes done."""
    for batch, done_bytes in _batches(files, plan, counts, skipped):
        body, lengths = encoder.encode(batch)  # one encode call for both splits, however few go to validation
        flags = None
        if threshold:
            flags = np.fromiter((is_val(t, threshold, key) for t in batch), bool, len(batch))
        yield {split: (with_eods(ids, doc_lengths, plan.tokenizer.eod_id), None, len(doc_lengths))
               for split, (ids, doc_lengths) in split_batch(body, lengths, flags).items()}, done_bytes


def _sft_pieces(files: list[InputFile], plan: Plan, counts: list[int], skipped: dict[int, str], encoder: Encoder,
                threshold: int, key: bytes) -> Pieces:
    """Per batch of supervised fine-tuning records: each split's (ids, loss mask, records), input bytes done."""
    from launcher.prepare.sft_records import encode_records, read_records, template_of

    template = template_of(plan)
    dtype = np.dtype(plan.tokenizer.dtype).newbyteorder("<")
    for i, file in enumerate(files):
        records = read_records(file, plan.options, template)
        while chunk := list(islice(records, BATCH_DOCS)):
            counts[i] += len(chunk)
            val = [bool(threshold) and is_val("".join(t for t, _ in r), threshold, key) for r in chunk]
            out: dict[str, tuple[np.ndarray, np.ndarray | None, int]] = {}
            for split, chosen in (("train", [r for r, v in zip(chunk, val, strict=True) if not v]),
                                  ("val", [r for r, v in zip(chunk, val, strict=True) if v])):
                if chosen:
                    ids, mask, _ = encode_records(chosen, encoder, plan.tokenizer.eod_id, dtype)
                    out[split] = (ids, mask, len(chosen))
            yield out, 0
        yield {}, file.bytes


def with_mask(shard: Shard | None, mask: ShardWriter | None) -> Shard | None:
    """The token shard with its loss-mask shard's digest and response-token count (contract/data/sft.py)."""
    if mask is None:
        return shard
    committed = mask.commit()
    if shard is None or committed is None:
        return shard
    return replace(shard, mask_sha256=committed.sha256, response_tokens=mask.responses)


def run_task(
    plan: Plan,
    index: int,
    encoder: Encoder | None = None,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Prepare task `index` of `plan` and write its completion record; returns the record. On any error the
    task's temporary files are removed and nothing of it looks complete."""
    root = Path(plan.out)
    remove_stale(plan, index)
    encoder = encoder or encoder_for(plan.tokenizer)
    files = plan.task_files(index)
    counts = [0] * len(files)
    skipped: dict[int, str] = {}
    writers = {split: ShardWriter(root, shard_name(split, index)) for split in SPLITS}
    threshold, key = val_threshold(plan.options.val_fraction), split_key(plan.options.split_seed)
    kill_at = os.environ.get(KILL_AT_TASK_ENV)
    masks = {split: ShardWriter(root, mask_path(shard_name(split, index))) for split in SPLITS} \
        if plan.options.sft is not None else {}
    pieces = (_sft_pieces if masks else _plain_pieces)(files, plan, counts, skipped, encoder, threshold, key)
    try:
        for parts, done_bytes in pieces:
            if should_stop is not None and should_stop():
                raise InterruptedError("stopped")
            written = 0
            for split, (stream, mask, documents) in parts.items():
                if documents:
                    writers[split].write(stream, documents)
                    if mask is not None:
                        masks[split].write(mask, documents)
                    written += len(stream)
            if kill_at is not None and int(kill_at) == index and written:
                os.kill(os.getpid(), signal.SIGKILL)  # a half-written shard left behind, as a real kill would
            if progress is not None:
                progress(done_bytes, written)
        shards = {split: with_mask(writer.commit(), masks.get(split)) for split, writer in writers.items()}
    except BaseException:
        for writer in [*writers.values(), *masks.values()]:
            writer.abort()
        raise
    record = {
        "task": index,
        "plan": plan.fingerprint,
        "shards": {split: None if s is None else vars(s) for split, s in shards.items()},
        "sources": [
            {"path": f.path, "bytes": f.bytes, "documents": n}
            for i, (f, n) in enumerate(zip(files, counts, strict=True))
            if i not in skipped
        ],
        "skipped": [{"path": files[i].path, "bytes": files[i].bytes, "reason": r} for i, r in skipped.items()],
    }
    write_json_atomic(record_path(plan, index), record)
    return record


def completed_record(plan: Plan, index: int, itemsize: int) -> dict[str, Any] | None:
    """The task's record when the task is complete for this plan (its record written and every shard it lists
    present with the size it says), else None."""
    try:
        record = json.loads(record_path(plan, index).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("plan") != plan.fingerprint or record.get("task") != index:
        return None
    for shard in (record.get("shards") or {}).values():
        if shard is None:
            continue
        try:
            if (Path(plan.out) / shard["path"]).stat().st_size != shard["tokens"] * itemsize:
                return None
            if shard.get("mask_sha256") and (Path(plan.out) / mask_path(shard["path"])).stat().st_size != \
                    shard["tokens"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return record
