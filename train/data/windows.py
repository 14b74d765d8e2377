"""Samples as windows of a token stream: one flat file, or many shards read as one stream.

A stream of T tokens holds W = (T - 1) // seq_len windows; window w is tokens [w * seq_len, (w + 1) * seq_len + 1)
(inputs plus the shifted target), so consecutive windows share one token and a window may span two shards. Global
sample i (or a source's ordinal i in a mixture) reads window order(i): epoch i // W, shuffled by index.py.

Windows are read with pread, not through a memory map: a window is a few kilobytes at a random place in the
stream, and a page fault on a mapping reads ahead (a hundred kilobytes and more) and costs a thousand times a
pread of the window itself on a large file (bench/data_scale.py). Shards are opened on first use and at most
OPEN_FILES stay open, so a stream of ten thousand shards opens with no more than their sizes (from the manifest of
a prepared dataset, or one stat per file).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contract.data.documents import document_ids
from train.data.index import INDEX_VERSION, Order, epoch_order

# Shard files held open at once (a corpus may have more shards than a process may open files).
OPEN_FILES = 64
# Token windows of one seed are shuffled with this salt (index version 1 used it in numpy's seed, [seed, 2, epoch]).
WINDOW_SALT = 2


class TokenStream:
    """Shards of one dtype, concatenated in the order given; `sizes` in tokens (None: from the files' sizes)."""

    def __init__(self, files: Sequence[Path | str], dtype: str, sizes: Sequence[int] | None = None) -> None:
        self.files = [Path(f).expanduser() for f in files]
        self.dtype = np.dtype(dtype).newbyteorder("<")  # token files are little-endian (numpy's tofile on x86)
        if sizes is None:
            sizes = [f.stat().st_size // self.dtype.itemsize for f in self.files]
        self.sizes = [int(s) for s in sizes]
        # starts[k]: the stream offset of shard k's first token; starts[-1]: the stream's length.
        self.starts = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).astype(np.int64)
        self.total = int(self.starts[-1])
        self._open: OrderedDict[int, int] = OrderedDict()  # shard -> file descriptor, least recently used first
        self._lock = threading.Lock()  # the prefetch thread and the training thread may both read

    def _read_shard(self, k: int, offset: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize
        with self._lock:
            fd = self._open.pop(k, None)
            if fd is None:
                fd = os.open(self.files[k], os.O_RDONLY)
                if len(self._open) >= OPEN_FILES:
                    os.close(self._open.popitem(last=False)[1])
            self._open[k] = fd
        data = os.pread(fd, count * size, offset * size)
        if len(data) != count * size:
            raise OSError(f"{self.files[k]} ended at token {offset + len(data) // size}, before token "
                          f"{offset + count} (was it shortened while training?)")
        return np.frombuffer(data, dtype=self.dtype).astype(np.int64)

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int64, across shard boundaries."""
        if start < 0 or start + length > self.total:
            raise IndexError(f"tokens {start}..{start + length} of a stream of {self.total}")
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces, position, end = [], start, start + length
        while position < end:
            while self.starts[k + 1] <= position:  # skip empty shards
                k += 1
            take = min(end, int(self.starts[k + 1])) - position
            pieces.append(self._read_shard(k, position - int(self.starts[k]), take))
            position += take
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def close(self) -> None:
        if hasattr(self, "_open"):  # not when __init__ failed before
            with self._lock:
                while self._open:
                    os.close(self._open.popitem()[1])

    def __del__(self) -> None:
        self.close()


class WindowSource:
    """A TokenSource of windows of a stream, in an order shuffled per epoch (train/data/index.py)."""

    def __init__(self, stream: TokenStream, seq_len: int, seed: int, shuffle: bool, name: str = "",
                 index_version: int = INDEX_VERSION, what: str = "", eod_id: int | None = None) -> None:
        """`eod_id`: the end-of-document id a prepared dataset records (None for a bare token file: its documents
        are unknown)."""
        self.stream, self.seq_len, self.eod_id, self.what = stream, seq_len, eod_id, what or str(stream.files[0])
        self.windows = (stream.total - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{what or stream.files[0]} holds {stream.total} tokens, fewer than one sample of "
                             f"{seq_len + 1}")
        self.order: Order = epoch_order(self.windows, seed, WINDOW_SALT, name, shuffle, index_version)

    def window_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.order(np.asarray(indices, dtype=np.int64))

    def sample(self, index: int) -> np.ndarray:
        return self.sample_batch([index])[0]

    def sample_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Tokens [len(indices), seq_len + 1] of these samples."""
        out = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, window in enumerate(self.window_of(indices).tolist()):
            out[row] = self.stream.read(window * self.seq_len, self.seq_len + 1)
        return out

    def document_ids(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """[len(indices), seq_len] int32: the document of each input token within its sample (data.document_mask)."""
        if self.eod_id is None:
            raise ValueError(f"{self.what} records no documents (not a prepared dataset), which "
                             "data.document_mask=true needs")
        return document_ids(self.sample_batch(indices)[:, :-1], self.eod_id)

    def epochs(self, samples: int) -> float:
        """Passes over the windows that `samples` samples make."""
        return samples / self.windows

    def progress(self, samples: int) -> dict[str, float]:
        """For metrics.jsonl: the epoch the run is in after `samples` samples (1.5: half-way through the second)."""
        return {"epoch": round(self.epochs(samples), 6)}


class MemmapTokens(WindowSource):
    """Windows of one flat binary file of token ids (data=tokens data.path=FILE)."""

    def __init__(self, path: str, dtype: str, seq_len: int, seed: int, shuffle: bool,
                 index_version: int = INDEX_VERSION) -> None:
        super().__init__(TokenStream([path], dtype), seq_len, seed, shuffle, index_version=index_version, what=path)


def stream_of(spec: Any) -> TokenStream:
    """The token stream of one resolved source (contract/data/spec.py SourceSpec)."""
    return TokenStream(spec.files, spec.dtype, spec.sizes)
