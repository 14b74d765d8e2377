"""What the build adds to the pages under docs/, by the path a page links it with (relative to docs/)."""

from __future__ import annotations

from collections.abc import Callable

from launcher.docs import commands_reference, config_reference

# Generated pages: path -> the function that writes it.
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
    return [*PAGES, *(f"{SHOWCASE_DIR}/{name}" for name in SHOWCASE_PNGS)]
