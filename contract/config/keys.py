"""How a key is declared: its default and valid range (num), and the ranges shared by several keys."""

from __future__ import annotations

from dataclasses import field
from typing import Any

# Seeds go to torch, numpy and Python's random alike; numpy takes 32 bits.
SEED_MAX = 2**32 - 1


def num(default: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
        hi_open: bool = False) -> Any:
    """A numeric key and its valid range ([lo, hi], an end excluded when *_open), checked at launch for every
    key by launcher/checks/key_checks.py: a bad value is refused with its range before anything runs."""
    return field(default=default, metadata={"range": (lo, hi, lo_open, hi_open)})


def path_key(default: str | None = None, *, each: str = "") -> Any:
    """A key naming a file, a directory or a glob (each="path": a dict whose every entry names one under that key,
    data.sources.NAME.path). Made absolute at launch, `~` expanded, against the directory the launcher runs in
    (launcher/plan/paths.py): config.yaml holds absolute paths that the ranks, evaluation jobs, launcher.sample and
    export read from any directory, and the derived run name hashes them."""
    if each:
        return field(default_factory=dict, metadata={"path": each})
    return field(default=default, metadata={"path": ""})
