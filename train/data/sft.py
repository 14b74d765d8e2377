"""Supervised fine-tuning samples: a prepared dataset's tokens with the loss mask beside them (contract/data/sft.py),
as (inputs, targets) whose targets outside the responses are IGNORE_INDEX. The mask travels in the targets, where
the labels go, so every strategy (DDP, FSDP, ZeRO, TP, a pipeline's last stage) and the validation pass leave the
prompts out of the loss as they leave out any ignored target.

    PackedSFT   data.sft_layout=packed: windows of seq_len + 1 over the stream, as for text
    PaddedSFT   data.sft_layout=padded: one record a sample, cut to seq_len + 1 tokens, the rest padding
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contract.data.sft import MASK_DTYPE, RECORD_START, RESPONSE
from train.data.batches import IGNORE_INDEX
from train.data.index import INDEX_VERSION, Order, epoch_order
from train.data.windows import TokenStream, WindowSource, stream_of

RECORD_SALT = 3  # records of one seed are shuffled with this salt (windows use 2)


def _targets(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The next-token targets of `tokens` (a row of n + 1), IGNORE_INDEX where the target is not a response token."""
    return np.where(mask[..., 1:] & RESPONSE, tokens[..., 1:], IGNORE_INDEX)


class PackedSFT(WindowSource):
    def __init__(self, stream: TokenStream, mask: TokenStream, seq_len: int, seed: int, shuffle: bool,
                 name: str = "", index_version: int = INDEX_VERSION, what: str = "",
                 eod_id: int | None = None) -> None:
        super().__init__(stream, seq_len, seed, shuffle, name, index_version, what, eod_id=eod_id)
        self.mask = mask

    def micro_batch(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.sample_batch(indices)
        mask = np.empty_like(tokens)
        for row, window in enumerate(self.window_of(indices).tolist()):
            mask[row] = self.mask.read(window * self.seq_len, self.seq_len + 1)
        return tokens[:, :-1], _targets(tokens, mask)

    def document_ids(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """data.document_mask: each input token's record within its window, from the mask's record starts (not
        from end-of-document ids, which a chat template may also use between turns)."""
        starts = np.empty((len(indices), self.seq_len), dtype=np.int64)
        for row, window in enumerate(self.window_of(indices).tolist()):
            starts[row] = self.mask.read(window * self.seq_len, self.seq_len) & RECORD_START
        return np.cumsum(starts > 0, axis=1)


class PaddedSFT:
    def __init__(self, stream: TokenStream, mask: TokenStream, seq_len: int, seed: int, shuffle: bool, pad_id: int,
                 name: str = "", index_version: int = INDEX_VERSION, what: str = "") -> None:
        self.stream, self.mask, self.seq_len, self.pad_id = stream, mask, seq_len, pad_id
        # Every record's first token, from the mask (read once: a byte a token).
        self.starts = np.flatnonzero(mask.read(0, mask.total) & RECORD_START).astype(np.int64)
        if len(self.starts) == 0:
            raise ValueError(f"{what or stream.files[0]} holds no record")
        self.ends = np.append(self.starts[1:], stream.total)
        self.windows = len(self.starts)  # samples per epoch (the name WindowSource's readers ask for)
        self.order: Order = epoch_order(self.windows, seed, RECORD_SALT, name, shuffle, index_version)

    def micro_batch(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = np.full((len(indices), self.seq_len), self.pad_id, dtype=np.int64)
        targets = np.full((len(indices), self.seq_len), IGNORE_INDEX, dtype=np.int64)
        for row, record in enumerate(self.order(np.asarray(indices, dtype=np.int64)).tolist()):
            start = int(self.starts[record])
            length = min(int(self.ends[record]) - start, self.seq_len + 1)
            tokens, mask = self.stream.read(start, length), self.mask.read(start, length)
            inputs[row, : length - 1] = tokens[:-1]
            targets[row, : length - 1] = _targets(tokens, mask)
        return inputs, targets

    def document_ids(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """data.document_mask: a sample is one record, one document (its padding attends within it, unscored)."""
        return np.zeros((len(indices), self.seq_len), dtype=np.int64)

    def sample(self, index: int) -> Any:
        inputs, targets = self.micro_batch([index])
        return inputs[0], targets[0]

    def epochs(self, samples: int) -> float:
        return samples / self.windows

    def progress(self, samples: int) -> dict[str, float]:
        return {"epoch": round(self.epochs(samples), 6)}


def sft_source(spec: Any, seq_len: int, seed: int, shuffle: bool, index_version: int = INDEX_VERSION,
               what: str = "") -> PackedSFT | PaddedSFT:
    """The samples of one resolved supervised fine-tuning source (contract/data/spec.py SourceSpec.is_sft)."""
    mask = TokenStream(spec.mask_files, MASK_DTYPE, spec.sizes)
    if spec.layout == "padded":
        return PaddedSFT(stream_of(spec), mask, seq_len, seed, shuffle, int(spec.eod_id), spec.name, index_version,
                         what)
    return PackedSFT(stream_of(spec), mask, seq_len, seed, shuffle, spec.name, index_version, what,
                     eod_id=spec.eod_id)


def source_of(spec: Any, seq_len: int, seed: int, shuffle: bool, index_version: int = INDEX_VERSION,
              what: str = "") -> Any:
    """One resolved source's samples: its windows, or with a loss mask its supervised fine-tuning samples."""
    if spec.is_sft:
        return sft_source(spec, seq_len, seed, shuffle, index_version, what)
    return WindowSource(stream_of(spec), seq_len, seed, shuffle, spec.name, index_version, what=what,
                        eod_id=spec.eod_id)
