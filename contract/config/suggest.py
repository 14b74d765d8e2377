"""Which declared key a misspelt one most likely means: one rule for the launch's key checks
(launcher/checks/key_checks.py) and the checks both sides run on a config's open sections (contract/data/spec.py).
"""

from __future__ import annotations

import difflib


def _similar(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def close_key(typed: str, keys: list[str]) -> str | None:
    """The declared key `typed` most likely misspells, or None. Close in spelling as a whole (max_step,
    microbatch_size) or word by word (batch_size for micro_batch_size); a shared word alone is not enough
    (eval_every is not log_every)."""
    words = [w for w in typed.split("_") if w]
    for key in difflib.get_close_matches(typed, keys, n=5, cutoff=0.6):
        if _similar(typed.replace("_", ""), key.replace("_", "")) >= 0.85:
            return key
        theirs = [w for w in key.split("_") if w]
        if all(any(_similar(w, t) >= 0.75 for t in theirs) for w in words):
            return key
    return None
