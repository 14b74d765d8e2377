"""Whether a path the user names can be written, asked before any work starts: by a probe (a temporary directory
made and removed at once), not by mode bits, which answer wrongly for root and for read-only file systems."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def unwritable(directory: Path) -> str | None:
    """Why files can't be written in `directory` (existing, or to be created with its parents), or None. The
    directory probed is `directory` itself when it exists, else its nearest existing parent."""
    base = directory
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"{base} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=base))
    except OSError as err:
        return f"{err.strerror} in {base}"
    return None
