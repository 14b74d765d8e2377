"""Each validation set's batches on this rank, read from its source at the first pass and kept for the later ones.

A set's samples are fixed (global sample indices [0, eval.batches x global batch), split like a training step), so
reading them again every pass buys nothing: the first pass keeps what it read, on the CPU (pinned when the model is
on a GPU, so the copy to the device overlaps), and later passes cost only the forward. What is kept is small:
eval.batches x global batch sequences per set, split over the data-parallel ranks. Above MAX_KEPT_BYTES per rank (all
sets together) a set is read again at every pass, as before, and rank 0 says so once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from train.data.batches import load_micro_batch

# What a rank keeps of its sets' batches at most; 512 MiB holds e.g. 8 batches of 1,024 sequences of 8,192 tokens
# split over 8 ranks (16 bytes a token: inputs and targets, int64) four times over.
MAX_KEPT_BYTES = 512 * 2**20

Batch = tuple[torch.Tensor, ...]  # inputs, targets (and document ids: data.document_mask)


def nbytes(batch: Batch) -> int:
    return sum(t.element_size() * t.nelement() for t in batch)


def size_text(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def samples_in(source: Any) -> int | None:
    """How many distinct samples a set's source holds; None for an unbounded one (the synthetic stream)."""
    for attr in ("windows", "size"):  # a token file's windows (WindowSource), a user's dataset's items
        count = getattr(source, attr, None)
        if isinstance(count, int):
            return count
    return None


class SetBatches:
    """The batches of every set, in the order a pass reads them: `groups` are the sample indices of each batch
    (a micro batch, or a pipeline step's micro batches together)."""

    def __init__(self, sources: dict[str, Any], groups: Sequence[Sequence[int]], pin: bool,
                 limit: int = MAX_KEPT_BYTES, documents: bool = False) -> None:
        self.sources, self.groups, self.pin, self.limit = sources, [list(g) for g in groups], pin, limit
        self.documents = documents
        self.kept: dict[str, list[Batch]] = {}
        self.not_kept: dict[str, int] = {}  # set -> the bytes its batches take here, read again every pass
        self.said = False

    def kept_bytes(self) -> int:
        return sum(nbytes(b) for batches in self.kept.values() for b in batches)

    def of(self, name: str) -> Iterator[Batch]:
        """The set's batches on the CPU: the kept ones, or read from its source (and kept if they fit)."""
        kept = self.kept.get(name)
        if kept is not None:
            yield from kept
            return
        keep: list[Batch] | None = None if name in self.not_kept else []
        room, size = self.limit - self.kept_bytes(), 0
        for indices in self.groups:
            batch = load_micro_batch(self.sources[name], indices, self.documents)
            size += nbytes(batch)
            if keep is not None and size > room:
                keep = None  # too large to keep: read again at every pass
                self.not_kept[name] = size
            if keep is not None:
                batch = tuple(x.pin_memory() for x in batch) if self.pin else batch
                keep.append(batch)
            yield batch
        if name in self.not_kept:
            self.not_kept[name] = size
        if keep is not None:
            self.kept[name] = keep

    def note(self) -> str | None:
        """Once, after the first pass: the sets too large to keep (None when every set was kept)."""
        if self.said or not self.not_kept:
            return None
        self.said = True
        sets = ", ".join(f"{name} ({size_text(size)})" for name, size in self.not_kept.items())
        return (f"validation reads {sets} again at every pass: keeping them would take more than "
                f"{size_text(self.limit)} of memory per rank (kept: {size_text(self.kept_bytes())}); fewer "
                "eval.batches make them fit")
