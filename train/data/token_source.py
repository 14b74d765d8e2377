"""TokenSource: what every source of samples is (a token file's windows, a mixture, a user's dataset, synthetic
tokens), read by global sample index. Below sources.py, which builds one, and batches.py, which reads them."""

from __future__ import annotations

from typing import Any, Protocol


class TokenSource(Protocol):
    def sample(self, index: int) -> Any:
        """The sample with this global index: tokens [seq_len + 1] (inputs plus the shifted target), an
        (inputs, targets) pair, or a dict with input_ids (and labels)."""
