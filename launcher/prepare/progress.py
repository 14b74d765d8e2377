"""Progress of a local preparation: a rich progress bar on a terminal, plain lines otherwise (logs, pipes)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


class Reporter:
    """Counts input bytes read and tokens written: a bar when stderr is a terminal, else a line per finished
    task on stdout (stderr stays for the error line)."""

    def __init__(
        self, total_bytes: int, tasks: int, terminal: IO[str] | None = None, lines: IO[str] | None = None
    ) -> None:
        terminal, self.stream = terminal or sys.stderr, lines or sys.stdout
        self.total_bytes, self.tasks = total_bytes, tasks
        self.bytes = self.tokens = self.done = 0
        self.start = time.monotonic()
        self.bar: Any = None
        if terminal.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("prepare"),
                BarColumn(),
                TextColumn("{task.percentage:>5.1f}%"),
                TextColumn("{task.fields[tasks]} tasks"),
                TextColumn("{task.fields[tokens]} tokens"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=terminal),
                transient=False,
            )
            self.bar_task = self.bar.add_task(
                "prepare", total=max(total_bytes, 1), tasks=f"0/{tasks}", tokens="0"
            )

    def __enter__(self) -> Reporter:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, read_bytes: int, tokens: int) -> None:
        self.bytes += read_bytes
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(self.bar_task, completed=self.bytes, tokens=f"{self.tokens:,}")

    def task_done(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.bar_task, tasks=f"{self.done}/{self.tasks}")
            return
        rate = self.bytes / max(time.monotonic() - self.start, 1e-9)
        print(
            f"prepare: {self.done}/{self.tasks} tasks done, {_mb(self.bytes)} of {_mb(self.total_bytes)} read, "
            f"{self.tokens:,} tokens written, {_mb(rate)}/s",
            file=self.stream,
            flush=True,
        )
