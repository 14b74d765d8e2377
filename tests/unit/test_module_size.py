"""No module over 350 lines in launcher/, train/, contract/ or bench/ (the house's rule, issue 48 item 29): a module
is read in one sitting; one that grows past it is split by responsibility."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "train", "contract", "bench")
MAX_LINES = 350


def test_no_module_over_350_lines() -> None:
    modules = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(modules) > 100  # the walk found the packages
    over = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each by responsibility): " + ", ".join(
        f"{path} ({n})" for path, n in sorted(over.items()))
