"""RUN_DIR/skipped_samples.json: the global sample ranges no step trains on, and the rollbacks so far.

    {"ranges": [[start, end, "why"], ...], "rollbacks": N}

A step's samples are the global batch from the data position (TrainState.samples); a step that would start in or
run into a skipped range starts after it instead (the few samples before a range that a changed global batch no
longer lines up with are skipped too). Written by rank 0 at a rollback, read by every rank at start, so that a
requeue or a resume skips the same samples. Pure Python.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

FILE_NAME = "skipped_samples.json"


class SkippedSamples:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / FILE_NAME
        self.ranges: list[tuple[int, int, str]] = []
        self.rollbacks = 0
        if self.path.is_file():
            data = json.loads(self.path.read_text())
            self.ranges = [(int(a), int(b), str(why)) for a, b, why in data.get("ranges", [])]
            self.rollbacks = int(data.get("rollbacks", 0))

    def start(self, position: int, global_batch: int) -> int:
        """Where a step that would start at `position` starts: past every skipped range its batch touches."""
        moved = True
        while moved:
            moved = False
            for a, b, _ in self.ranges:
                if a < position + global_batch and b > position:
                    position, moved = b, True
        return position

    def starts(self, position: int, steps: int, global_batch: int) -> Iterator[int]:
        """The start of each of the next `steps` steps (what the prefetcher plans on)."""
        for _ in range(steps):
            position = self.start(position, global_batch)
            yield position
            position += global_batch

    def add_rollback(self, ranges: list[tuple[int, int]], why: str, *, write: bool) -> None:
        """One rollback, and the ranges it skips (rank 0 writes the file; every rank keeps the same in memory)."""
        self.ranges += [(a, b, why) for a, b in ranges]
        self.rollbacks += 1
        if write:
            self._write()

    def _write(self) -> None:
        data = {"ranges": [list(r) for r in self.ranges], "rollbacks": self.rollbacks}
        tmp = self.path.with_name(f".{FILE_NAME}.tmp")
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, self.path)
