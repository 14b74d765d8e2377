"""Standard output and error that a closed terminal can't take down (the launcher's and every rank's).

A pipe whose reader is gone (`| head`, a dead `tee`) or a terminal that hung up (a dropped SSH session) fails every
later write (EPIPE, EIO). What goes there is only a copy for whoever watches: the record of a run is its run
directory (logs/rank_N.log, metrics.jsonl, events.jsonl). So from the first such failure on, the stream's
descriptor writes to /dev/null, for every writer in the process alike (print, logging, rich, wandb's console
capture, C code, the interpreter's flush at exit), and the write that failed returns as if written: the run goes
on and ends as it would have. Streams on a regular file (a SLURM job's output) or without a descriptor (a test's
capture) are left as they are. Stdlib only: the ranks install it before importing torch.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
import threading
from collections.abc import Callable

# What a write to a pipe, socket or terminal whose other end went away fails with.
GONE = (errno.EPIPE, errno.ECONNRESET, errno.EIO)

_on_gone: Callable[[str], None] | None = None
_lock = threading.Lock()


class _Writer(io.FileIO):
    """The stream's descriptor (never closed here: it is the process's own), written in full or, once its other end
    is gone, not at all."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__(fd, "wb", closefd=False)
        self.stream_name = name
        self.gone = False

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        size = len(view)
        while view and not self.gone:
            try:
                written = super().write(view)
            except OSError as err:
                if err.errno not in GONE:
                    raise
                self._lose()
                break
            view = view[written or 0:]
        return size

    def _lose(self) -> None:
        with _lock:
            if self.gone:
                return
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.fileno())
            finally:
                os.close(devnull)
            self.gone = True
        if _on_gone is not None:
            _on_gone(self.stream_name)


def outlive_terminal(on_gone: Callable[[str], None] | None = None) -> None:
    """Put sys.stdout and sys.stderr on writers that outlive their terminal; `on_gone(name)` is called once per
    stream that went away (a rank notes it in its log file). Calling it again only replaces `on_gone`."""
    global _on_gone
    if on_gone is not None:
        _on_gone = on_gone
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(getattr(stream, "buffer", None), _Writer):
            continue
        try:
            fd = stream.fileno()
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except (AttributeError, OSError, ValueError):
            continue
        if regular:
            continue
        try:
            stream.flush()
        except OSError:
            pass  # gone already: what it held is lost with the terminal
        setattr(sys, name, io.TextIOWrapper(_Writer(fd, name), encoding=stream.encoding, errors=stream.errors,
                                            write_through=True))
