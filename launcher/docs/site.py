"""What is generated for the pages under docs/, by the path a page links it with (relative to docs/).

The reference pages are committed, so that links to them work in a checkout; `make reference` writes them again
(launcher/docs/references.py), and a test and the site's build fail while they differ from a fresh generation. The
showcase run's figures are made by each build and never committed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from launcher.docs import commands_reference, config_reference

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The one command that writes the reference pages again (after a schema key or a command's flag changed).
REGENERATE = "make reference"
# Generated pages, committed: path -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/config.md": config_reference.render,
    "reference/commands.md": commands_reference.render,
}
# The showcase run's figures, launcher.report's names: docs/telemetry.md shows them as ![...](generated/loss.png).
SHOWCASE_DIR = "generated"
SHOWCASE_PNGS = ("loss.png", "tokens_per_s.png")
# A line of its own in a page, replaced by launcher.status's table of the showcase run.
STATUS_MARKER = "<!-- generated: status -->"


def generated_paths() -> list[str]:
    """What only the site's build makes (not in a checkout): the showcase run's figures."""
    return [f"{SHOWCASE_DIR}/{name}" for name in SHOWCASE_PNGS]


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The committed reference pages that differ from a fresh generation (or are missing), as docs/PATH."""
    return [f"docs/{path}" for path, render in PAGES.items()
            if not (docs / path).is_file() or (docs / path).read_text(encoding="utf-8") != render()]


def stale_words(stale: list[str]) -> str:
    """One line: which pages are stale and the command that writes them."""
    return (f"{', '.join(stale)} differ from a fresh generation (a schema key or a command's flag changed): run "
            f"`{REGENERATE}` and commit the pages")
