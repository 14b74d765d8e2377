"""`python -m launcher.docs.references [--check]` (`make reference`): write docs/reference/config.md and commands.md
from the schema and the commands' parsers; --check writes nothing and exits 1 when a committed page is stale."""

from __future__ import annotations

import argparse
import sys

from launcher.docs.site import DOCS, PAGES, stale_pages, stale_words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.docs.references", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    stale = stale_pages()
    if args.check:
        if stale:
            print(f"error: {stale_words(stale)}", file=sys.stderr)
            return 1
        return 0
    for path, render in PAGES.items():
        if f"docs/{path}" in stale:
            (DOCS / path).parent.mkdir(parents=True, exist_ok=True)
            (DOCS / path).write_text(render(), encoding="utf-8")
    print(f"rewrote {', '.join(stale)}" if stale else "the reference pages are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
