"""A character-level dataset over a text file: item i is the window of seq_len + 1 characters at i * seq_len.

slurmtrain builds it from conf/data/chars.yaml (`_target_: data.CharDataset`). Any map-style dataset works
(`__len__` and `__getitem__`): slurmtrain addresses samples by a global index, shards them across ranks and resumes
exactly from a checkpoint, whatever the number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

HERE = Path(__file__).resolve().parent


class CharDataset(Dataset):
    def __init__(self, path: str = "corpus.txt", seq_len: int = 64, vocab_size: int = 128) -> None:
        file = Path(path) if Path(path).is_absolute() else HERE / path
        text = file.read_text(encoding="utf-8")
        # Bytes folded into the vocabulary: no tokenizer to ship.
        self.tokens = torch.tensor([b % vocab_size for b in text.encode("utf-8")], dtype=torch.long)
        self.seq_len = seq_len
        if len(self.tokens) <= seq_len:
            raise ValueError(f"{file} has {len(self.tokens)} characters, fewer than one sample of {seq_len + 1}")

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> torch.Tensor:
        start = index * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]
